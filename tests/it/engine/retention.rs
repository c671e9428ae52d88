use crate::support::{self, handlers::Recording};
use dedupq::config::Settings;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn purge_removes_only_old_finished_keys_in_batches() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::default());
    let engine = support::engine(&store, handler, support::fast_options());
    let batch: Vec<_> = (0..7)
        .map(|i| support::message("acme", &format!("k{i}"), r#"{"amount": 1}"#))
        .collect();
    engine.process(&batch).await.unwrap();
    // k0..k4 claimed and finished two days ago; k5, k6 just now.
    sqlx::query(
        "UPDATE dedupq_keys SET created_at = now() - interval '2 days', \
         completed_at = now() - interval '2 days' WHERE key IN ('k0','k1','k2','k3','k4')",
    )
    .execute(store.pool())
    .await
    .unwrap();
    // Open keys as old as can be: never purged.
    sqlx::query(
        "INSERT INTO dedupq_keys (tenant, key, fingerprint, fingerprint_version, status, epoch, lease_until, owner, attempts, created_at, updated_at, uncertain_since) VALUES \
         ('acme', 'open', '\\x00', 1, 'in_progress', 1, now() - interval '3 days', 'w', 1, now() - interval '3 days', now() - interval '3 days', NULL), \
         ('acme', 'unsure', '\\x00', 1, 'unknown', 1, now() - interval '3 days', 'w', 1, now() - interval '3 days', now() - interval '3 days', now() - interval '3 days')",
    )
    .execute(store.pool())
    .await
    .unwrap();

    let first_batch = store
        .purge_batch(Duration::from_secs(24 * 3600), 2)
        .await
        .unwrap();
    assert_eq!(first_batch, 2, "one batch deletes at most its limit");
    let rest = store
        .purge(Duration::from_secs(24 * 3600), 2)
        .await
        .unwrap();
    assert_eq!(rest, 3);

    let mut left: Vec<String> = sqlx::query_scalar("SELECT key FROM dedupq_keys")
        .fetch_all(store.pool())
        .await
        .unwrap();
    left.sort();
    assert_eq!(left, ["k5", "k6", "open", "unsure"]);
}

/// Purges walk the creation index: a key claimed long ago but finished
/// only recently (an unknown outcome settled late) keeps its full
/// retention after it finished.
#[tokio::test]
async fn a_key_claimed_long_ago_but_finished_recently_is_kept() {
    let (store, _) = support::isolated_store().await;
    let engine = support::engine(
        &store,
        Arc::new(Recording::default()),
        support::fast_options(),
    );
    let batch: Vec<_> = ["late", "old"]
        .iter()
        .map(|k| support::message("acme", k, r#"{"amount": 1}"#))
        .collect();
    engine.process(&batch).await.unwrap();
    sqlx::query(
        "UPDATE dedupq_keys SET created_at = now() - interval '3 days', \
         completed_at = CASE key WHEN 'late' THEN now() - interval '1 hour' \
                                 ELSE now() - interval '2 days' END",
    )
    .execute(store.pool())
    .await
    .unwrap();

    let purged = store
        .purge(Duration::from_secs(24 * 3600), 10)
        .await
        .unwrap();
    assert_eq!(purged, 1);
    let left: Vec<String> = sqlx::query_scalar("SELECT key FROM dedupq_keys")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(left, ["late"]);
}

#[test]
fn a_retention_shorter_than_the_redelivery_horizon_is_refused() {
    let mut settings = Settings::default();
    settings.handler.retry_for = Duration::from_secs(1800);
    settings.retention.keep = Duration::from_secs(3600).into();
    settings.retention.redelivery_horizon = Duration::from_secs(2 * 3600);
    let err = settings.validate().unwrap_err();
    assert_eq!(err.setting, "retention.keep");
    assert!(err.to_string().contains("redelivery horizon"), "{err}");

    settings.retention.keep = Duration::from_secs(3 * 3600).into();
    assert!(settings.validate().is_ok());
}

#[test]
fn dedupq_refuses_to_start_with_a_too_short_retention_and_names_the_setting() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedupq"))
        .arg("migrate")
        .env("DEDUPQ__RETENTION__KEEP", "30m")
        .env("DEDUPQ__RETENTION__REDELIVERY_HORIZON", "1h")
        .output()
        .expect("run dedupq");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("retention.keep"), "{stderr}");
    assert!(stderr.contains("DEDUPQ__RETENTION__KEEP"), "{stderr}");
}

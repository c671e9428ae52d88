use crate::support::{self, handlers::Recording, process::metric_value};
use dedupq::config::{HttpSettings, Settings, StoreSettings};
use dedupq::startup::Application;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The application over `store`, with a recording handler and its
/// operator endpoint on a free port; not yet running.
async fn build(store: StoreSettings) -> Application {
    let settings = Settings {
        store,
        http: HttpSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..HttpSettings::default()
        },
        ..Settings::default()
    };
    Application::build_with_handler(settings, Arc::new(Recording::default()))
        .await
        .unwrap()
}

/// `/metrics` at `addr`, or None if it cannot be read.
async fn scrape(addr: SocketAddr) -> Option<String> {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()
}

#[tokio::test]
async fn metrics_report_known_input_and_readyz_reflects_the_store() {
    let (_, store_settings) = support::isolated_store().await;
    let app = build(store_settings).await;
    let addr = app.local_addr();
    let engine = app.pipeline().clone();
    let stop = app.shutdown_token();
    let batch = [
        support::message("acme", "m1", r#"{"amount": 1}"#),
        support::message("acme", "m2", r#"{"amount": 2}"#),
        support::message("acme", "m1", r#"{"amount": 1}"#),
        support::message("acme", "m2", r#"{"amount": 99}"#),
        support::message("acme", "m3", "not json"),
    ];
    engine.process(&batch).await.unwrap();
    // Served from here on; the key gauges are sampled when upkeep starts.
    let running = tokio::spawn(app.run_until_stopped());

    let text = scrape(addr).await.expect("GET /metrics");
    let v = |series: &str| metric_value(&text, series);
    assert_eq!(v(r#"dedupq_messages_total{outcome="processed""#), 2.0);
    assert_eq!(v(r#"dedupq_messages_total{outcome="duplicate""#), 1.0);
    assert_eq!(v(r#"dedupq_messages_total{outcome="conflict""#), 1.0);
    assert_eq!(v(r#"dedupq_messages_total{outcome="invalid""#), 1.0);
    assert_eq!(v(r#"dedupq_claims_total{result="won""#), 2.0);
    // Decided, but nothing was published: dead letters are counted once a
    // broker confirmed them (the transport tests check that), not here.
    assert_eq!(v("dedupq_dead_letters_total"), 0.0);
    assert_eq!(v("dedupq_handler_duration_seconds_count"), 2.0);
    assert_eq!(
        v("dedupq_claim_batch_size_count"),
        2.0,
        "two rounds: first occurrences, then repeats"
    );
    assert_eq!(v("dedupq_fenced_writes_total"), 0.0);
    assert!(!text.contains("acme"), "no tenant or key in any label");

    let done = support::eventually(Duration::from_secs(20), "key gauge sampled", || async {
        let text = scrape(addr).await?;
        let done = metric_value(&text, r#"dedupq_keys{status="done""#);
        (done > 0.0).then_some(done)
    })
    .await;
    assert_eq!(done, 2.0);

    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    assert!(ready.text().await.unwrap().contains("store up"));
    assert_eq!(
        reqwest::get(format!("http://{addr}/healthz"))
            .await
            .unwrap()
            .status(),
        200
    );

    stop.cancel();
    running.await.unwrap().unwrap();
}

/// A key table too large to scan at start-up (over 256 MB on disk, here
/// 40 000 rows of ~800 bytes at a fill factor of 10: one a page) is first
/// counted by status a
/// minute after the upkeep starts: the unknown gauge (read through its
/// index) comes at once, the scanned ones do not.
#[tokio::test]
async fn a_large_key_table_is_not_scanned_at_start_up() {
    let (store, store_settings) = support::isolated_store().await;
    let parts: Vec<String> = sqlx::query_scalar(
        "SELECT inhrelid::regclass::text FROM pg_inherits \
         WHERE inhparent = 'dedupq_keys'::regclass",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    for part in &parts {
        sqlx::query(&format!("ALTER TABLE {part} SET (fillfactor = 10)"))
            .execute(store.pool())
            .await
            .unwrap();
    }
    sqlx::query(
        "INSERT INTO dedupq_keys (tenant, key, fingerprint, fingerprint_version, status, \
             epoch, owner, attempts, result_status, result_body, completed_at) \
         SELECT 'acme', 'big-' || g, '\\x00', 2, 'done', 1, 'filler', 1, 200, \
                convert_to(repeat('x', 700), 'UTF8'), now() \
         FROM generate_series(1, 40000) AS g",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let bytes = store.table_bytes().await.unwrap();
    assert!(bytes > 256 << 20, "the table is large: {bytes} bytes");

    let app = build(store_settings).await;
    let addr = app.local_addr();
    let stop = app.shutdown_token();
    let running = tokio::spawn(app.run_until_stopped());
    // The upkeep runs: the unknown keys are counted at once.
    support::eventually(Duration::from_secs(20), "unknown gauge sampled", || async {
        let text = scrape(addr).await?;
        text.contains(r#"dedupq_keys{status="unknown"}"#)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let text = scrape(addr).await.unwrap();
    assert!(
        !text.contains(r#"dedupq_keys{status="done"}"#),
        "the 40 000 done keys were scanned at start-up:\n{}",
        text.lines()
            .filter(|l| l.starts_with("dedupq_keys"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    stop.cancel();
    running.await.unwrap().unwrap();
}

/// `dedupq_keys_abandoned` counts the `in_progress` keys whose lease ended
/// over 15 minutes ago (no delivery took them over: a sync request whose
/// client never retried), and only those: not a live lease, not one that
/// ended a few minutes ago (a takeover may still come), not a finished key.
#[tokio::test]
async fn keys_left_in_progress_long_past_their_lease_are_counted_as_abandoned() {
    let (store, store_settings) = support::isolated_store().await;
    for (key, status, lease_ended_ago_s) in [
        ("abandoned-1", "in_progress", 20 * 60),
        ("abandoned-2", "in_progress", 3 * 3600),
        ("recent", "in_progress", 5 * 60),
        ("live", "in_progress", -60),
        ("finished", "done", 3600),
    ] {
        sqlx::query(
            "INSERT INTO dedupq_keys (tenant, key, fingerprint, fingerprint_version, status, \
                 epoch, owner, attempts, lease_until, created_at, completed_at) \
             VALUES ('acme', $1, '\\x00', 2, $2, 1, 'gone', 1, \
                 now() - make_interval(secs => $3), now() - interval '4 hours', \
                 CASE WHEN $2 = 'done' THEN now() END)",
        )
        .bind(key)
        .bind(status)
        .bind(f64::from(lease_ended_ago_s))
        .execute(store.pool())
        .await
        .unwrap();
    }
    let app = build(store_settings).await;
    let addr = app.local_addr();
    let stop = app.shutdown_token();
    let running = tokio::spawn(app.run_until_stopped());

    let text = support::eventually(Duration::from_secs(20), "key gauges sampled", || async {
        let text = scrape(addr).await?;
        (metric_value(&text, r#"dedupq_keys{status="done""#) > 0.0).then_some(text)
    })
    .await;
    assert_eq!(
        metric_value(&text, r#"dedupq_keys{status="in_progress""#),
        4.0
    );
    assert_eq!(metric_value(&text, "dedupq_keys_abandoned"), 2.0);

    stop.cancel();
    running.await.unwrap().unwrap();
}

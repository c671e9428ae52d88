//! `dedupq keys list --tenant` and its two output forms, the purge guard
//! against the redelivery horizon, and who the audit row names.

use crate::support::{self, cli};
use dedupq::config::StoreSettings;
use dedupq::store::Store;

fn config(store: &StoreSettings) -> std::path::PathBuf {
    let text = format!(
        "[store]\nurl = \"{}\"\nschema = \"{}\"\n[handler]\nretry_for = \"1h\"\n\
         [retention]\nkeep = \"24h\"\nredelivery_horizon = \"6h\"\n",
        store.url.expose(),
        store.schema.as_deref().unwrap()
    );
    cli::config_file(&text.parse().unwrap())
}

/// Stuck keys (`unknown`) of two tenants, and one old finished key.
async fn rows(store: &Store) {
    sqlx::query(
        "INSERT INTO dedupq_keys (tenant, key, fingerprint, fingerprint_version, status, epoch, \
         owner, attempts, created_at, completed_at, uncertain_since) VALUES \
         ('acme', 'u1', '\\x00', 1, 'unknown', 1, 'w', 1, now(), NULL, now()), \
         ('acme', 'u2', '\\x00', 1, 'unknown', 1, 'w', 1, now(), NULL, now()), \
         ('globex', 'u3', '\\x00', 1, 'unknown', 1, 'w', 1, now(), NULL, now()), \
         ('acme', 'old', '\\x00', 1, 'done', 1, 'w', 1, now() - interval '3 hours', \
          now() - interval '3 hours', NULL)",
    )
    .execute(store.pool())
    .await
    .unwrap();
}

#[tokio::test]
async fn keys_list_filters_by_tenant_in_json_and_in_a_table() {
    let (store, settings) = support::isolated_store().await;
    rows(&store).await;
    let config = config(&settings);
    let acme = cli::run(&config, &["keys", "list", "--tenant", "acme"], &[]).json_lines();
    let mut keys: Vec<&str> = acme.iter().map(|r| r["key"].as_str().unwrap()).collect();
    keys.sort();
    assert_eq!(
        keys,
        ["u1", "u2"],
        "JSON lines when stdout is not a terminal"
    );
    let globex = cli::run(
        &config,
        &["keys", "list", "--unknown", "--tenant", "globex"],
        &[],
    );
    assert_eq!(globex.json_lines().len(), 1);

    let table = cli::run(
        &config,
        &["keys", "list", "--tenant", "acme", "--output", "table"],
        &[],
    );
    assert_eq!(table.code, 0, "{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(
        lines[0].starts_with("TENANT") && lines[0].contains("STATUS"),
        "{}",
        table.stdout
    );
    assert_eq!(lines.len(), 3, "a header and two rows:\n{}", table.stdout);
    assert!(lines[1..]
        .iter()
        .all(|l| l.starts_with("acme") && l.contains("unknown")));

    let bad = cli::run(&config, &["keys", "list", "--tenant", "bad tenant"], &[]);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("--tenant"), "{}", bad.stderr);
}

#[tokio::test]
async fn keys_purge_refuses_an_age_within_the_redelivery_horizon_unless_forced() {
    let (store, settings) = support::isolated_store().await;
    rows(&store).await;
    let config = config(&settings);
    let refused = cli::run(&config, &["keys", "purge", "--older-than", "2h"], &[]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("redelivery horizon 6h") && refused.stderr.contains("--force"),
        "{}",
        refused.stderr
    );
    assert_eq!(support::count_rows(&store).await, 4, "nothing purged");

    let over = cli::run(&config, &["keys", "purge", "--older-than", "7h"], &[]);
    assert_eq!(
        (over.code, over.stdout.trim()),
        (0, "purged 0 finished keys older than 7h")
    );

    let forced = cli::run(
        &config,
        &["keys", "purge", "--older-than", "2h", "--force"],
        &[],
    );
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    assert!(forced.stdout.contains("purged 1 "), "{}", forced.stdout);
    assert_eq!(
        support::count_rows(&store).await,
        3,
        "only the finished key went"
    );
}

#[tokio::test]
async fn the_audit_actor_is_the_flag_then_user_then_the_host_name() {
    let (store, settings) = support::isolated_store().await;
    rows(&store).await;
    let config = config(&settings);
    let release = |key: &str, extra: &[&str], env: &[(&str, &str)]| {
        let args = [
            &["keys", "release", "acme", key, "--reason", "INC-1"][..],
            extra,
        ]
        .concat();
        let ran = cli::run(&config, &args, env);
        assert_eq!(ran.code, 0, "{}", ran.stderr);
    };
    release("u1", &["--actor", "alice"], &[("USER", "bob")]);
    release("u2", &[], &[("USER", "bob")]);
    release("u1", &[], &[("USER", "")]);
    let actors: Vec<String> = sqlx::query_scalar("SELECT actor FROM dedupq_key_audit ORDER BY id")
        .fetch_all(store.pool())
        .await
        .unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(actors, ["alice", "bob", host.trim()]);
}

/// A key left `in_progress` past its lease with no delivery to come (a
/// sync request whose process died and whose client never retried, an
/// outcome a failover lost) used to stay stuck: `keys settle` took only
/// `unknown` keys. It now settles one whose lease has ended, refuses one
/// whose lease is live, and moves the epoch on, so the worker that held
/// it can write nothing more.
#[tokio::test]
async fn keys_settle_takes_a_key_in_progress_past_its_lease_and_fences_its_old_worker() {
    use dedupq::config::IdentitySettings;
    use dedupq::engine::Parser;
    use dedupq::store::{Answer, ClaimResult, Finish, FinishWrite, KeyStatus, Written};

    let (store, settings) = support::isolated_store().await;
    let config = config(&settings);
    let claim = |key: &'static str, lease: std::time::Duration| {
        let store = store.clone();
        async move {
            let msg = support::message("acme", key, r#"{"amount": 5}"#);
            let parsed = Parser::new(&IdentitySettings::default())
                .parse(&msg)
                .unwrap();
            let request = support::claim_request(&parsed, &msg);
            let won = store.claim_batch(&[request], "gone", lease).await.unwrap();
            let [ClaimResult::Won(won)] = &won[..] else {
                panic!("a new key is won: {won:?}");
            };
            (parsed.identity, won.epoch)
        }
    };
    let (ended, old_epoch) = claim("ended-1", std::time::Duration::from_secs(1)).await;
    let (live, _) = claim("live-1", std::time::Duration::from_secs(600)).await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;

    let settle = |key: &str| {
        cli::run(
            &config,
            &[
                "keys",
                "settle",
                "acme",
                key,
                "--done",
                "--result",
                r#"{"id":"ch_9"}"#,
                "--reason",
                "INC-9: provider shows ch_9",
            ],
            &[],
        )
    };
    let refused = settle("live-1");
    assert_ne!(
        refused.code, 0,
        "a live lease: its worker may be calling now"
    );
    assert!(refused.stderr.contains("in_progress"), "{}", refused.stderr);
    let row = store.show_key(&live).await.unwrap().unwrap();
    assert_eq!(row.status, KeyStatus::InProgress);

    let settled = settle("ended-1");
    assert_eq!(settled.code, 0, "{}", settled.stderr);
    assert!(
        settled.stdout.contains("was in_progress"),
        "{}",
        settled.stdout
    );
    let row = store.show_key(&ended).await.unwrap().unwrap();
    assert_eq!(row.status, KeyStatus::Done);
    assert_eq!(
        row.result_body.map(|b| b.get().to_string()).as_deref(),
        Some(r#"{"id":"ch_9"}"#)
    );
    assert!(row.epoch > old_epoch.0, "the epoch moves on");

    let late = store
        .finish_batch(&[FinishWrite {
            identity: &ended,
            epoch: old_epoch,
            finish: Finish::Done(Answer {
                status: 201,
                body: br#"{"id":"ch_other"}"#.to_vec(),
                content_type: None,
            }),
            at: None,
        }])
        .await
        .unwrap();
    assert_eq!(
        late,
        vec![Written::Fenced],
        "the old worker's answer must not land"
    );
    let row = store.show_key(&ended).await.unwrap().unwrap();
    assert_eq!(
        row.result_body.map(|b| b.get().to_string()).as_deref(),
        Some(r#"{"id":"ch_9"}"#)
    );
    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action FROM dedupq_key_audit ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(actions, ["settle_done"]);
}

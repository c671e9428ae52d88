//! dedupq behind PgBouncer, the pooler a deployment puts in front of
//! PostgreSQL when replicas run out of connections (`dedupq check` advises
//! one). PgBouncer refuses a startup parameter it does not know (the
//! driver's `extra_float_digits`, and `options`, where dedupq put its
//! session settings), so dedupq could not connect through it at all; told
//! to ignore them, it would have dropped the schema, the row-lock wait and
//! the commit's durability without a word. dedupq now sends neither and
//! sets its session with `SET`s the moment a connection opens: through a
//! PgBouncer in session mode, payments are charged once and replayed, with
//! every setting in force even for a role whose defaults say otherwise,
//! and one replica leads the upkeep.

use super::harness::{scratch, settings, App};
use crate::support::cli;
use crate::support::pg_faults::FaultyRole;
use crate::support::pooler::PgBouncer;
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store};
use dedupq::config::SecretUrl;
use dedupq_provider::Knobs;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_through_pgbouncer_in_session_mode_are_charged_once_with_dedupqs_session_settings()
{
    let provider = Provider::start(Knobs::default()).await;
    let role = FaultyRole::create().await;
    // Defaults dedupq must not inherit.
    role.set("synchronous_commit", Some("off")).await;
    role.set("lock_timeout", Some("0")).await;
    role.set("enable_seqscan", Some("on")).await;
    let bouncer = PgBouncer::start("session", &[&role.url()]).await;
    let (_, store) = isolated_store().await;
    let mut store = role.store_settings(&store);
    store.url = SecretUrl::new(bouncer.url(&role.url()));
    let schema = store.schema.clone().expect("an isolated schema");
    // Before, start-up waited for ever: every connection was refused
    // ("unsupported startup parameter: extra_float_digits").
    let app = tokio::time::timeout(
        Duration::from_secs(60),
        App::start(settings(&store, &provider, &scratch())),
    )
    .await
    .unwrap_or_else(|_| panic!("not started through PgBouncer:\n{}", bouncer.log()));
    app.wait_ready().await;

    for i in 0..5 {
        let body = format!(r#"{{"amount": {}, "currency": "EUR"}}"#, 100 + i);
        let first = app.pay(&format!("pooled-{i}"), &body).await;
        assert_eq!(first.status, 201, "{}", first.text);
        let again = app.pay(&format!("pooled-{i}"), &body).await;
        assert_eq!(again.status, 201, "{}", again.text);
        assert!(again.replayed(), "the repeat is the stored answer");
    }
    assert_eq!(
        provider.stats().await.charges,
        5,
        "each payment charged once"
    );

    // A session of dedupq's pool, through the pooler.
    let (durability, lock_wait, seqscan, current): (String, String, String, String) =
        sqlx::query_as(
            "SELECT current_setting('synchronous_commit'), \
                    (SELECT setting FROM pg_settings WHERE name = 'lock_timeout'), \
                    current_setting('enable_seqscan'), current_schema()",
        )
        .fetch_one(app.store.pool())
        .await
        .expect("read the session's settings");
    assert_eq!(
        durability, "on",
        "store.synchronous_commit, not the role's off"
    );
    assert_eq!(
        lock_wait,
        store.lock_timeout.as_millis().to_string(),
        "store.lock_timeout, not the role's 0"
    );
    assert_eq!(seqscan, "off", "dedupq's planning");
    assert_eq!(current, schema, "store.schema");
    eventually(Duration::from_secs(20), "an upkeep leader", || async {
        (app.metrics.upkeep_leader.get() == 1).then_some(())
    })
    .await;

    app.stop().await;
    drop(bouncer);
    role.drop().await;
}

/// A pooler that shares server sessions between transactions (PgBouncer's
/// transaction and statement modes) would run dedupq's statements without
/// its session settings and let two replicas hold the upkeep lock:
/// `dedupq run` and `dedupq migrate` refuse to start, naming store.url and
/// the mode to use, and `dedupq check` fails its `store.sessions` line. Session mode, and
/// PostgreSQL itself, pass the same check.
#[tokio::test]
async fn a_pooler_in_transaction_or_statement_mode_stops_start_up_and_fails_the_check() {
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = isolated_store().await;
    let url = store.url.expose().to_owned();
    for mode in ["transaction", "statement"] {
        let bouncer = PgBouncer::start(mode, &[&url]).await;
        let mut pooled = store.clone();
        pooled.url = SecretUrl::new(bouncer.url(&url));
        let config = base_config(&pooled, &provider);

        let (code, log) = Dedupq::run_to_exit(&config, Duration::from_secs(60)).await;
        assert_eq!(code, Some(1), "{mode}: start-up stops:\n{log}");
        assert!(
            log.contains("store.url leads to a pooler that shares PostgreSQL sessions")
                && log.contains("pool_mode = session"),
            "{mode}: the reason names the setting and the fix:\n{log}"
        );

        let file = cli::config_file(&config);
        // The configuration file's URL, whatever the environment says.
        let env = [("DEDUPQ__STORE__URL", pooled.url.expose())];
        let ran = cli::run(&file, &["migrate"], &env);
        assert!(
            ran.code == 1 && ran.stderr.contains("pool_mode = session"),
            "{mode}: dedupq migrate refuses too: {}{}",
            ran.stdout,
            ran.stderr
        );
        let ran = cli::run(&file, &["check"], &env);
        assert_eq!(ran.code, 1, "{mode}: {}{}", ran.stdout, ran.stderr);
        let line = ran
            .stdout
            .lines()
            .find(|l| l.contains("store.sessions"))
            .unwrap_or_else(|| panic!("{mode}: no store.sessions line:\n{}", ran.stdout));
        assert!(line.starts_with("fail"), "{mode}: {line}");
    }
    let session = PgBouncer::start("session", &[&url]).await;
    for url in [session.url(&url), url.clone()] {
        let mut direct = store.clone();
        direct.url = SecretUrl::new(url.clone());
        let config = cli::config_file(&base_config(&direct, &provider));
        let ran = cli::run(&config, &["check"], &[("DEDUPQ__STORE__URL", &url)]);
        assert!(
            ran.stdout
                .lines()
                .any(|l| l.starts_with("ok") && l.contains("store.sessions")),
            "{url}: {}{}",
            ran.stdout,
            ran.stderr
        );
    }
}

//! PostgreSQL runs out of connections for dedupq's role (SQLSTATE 53300)
//! after the provider charged and before the outcome is stored: every
//! session is cut and no new one is let in. The answer is kept and stored
//! once sessions are let in again; nothing is committed or dead-lettered
//! before that; a payment arriving meanwhile waits and runs once.

use super::common::{charged, status, KafkaRun, TENANT};
use crate::support::pg_faults::FaultyRole;
use crate::support::process::base_config;
use crate::support::process::Provider;
use crate::support::{eventually, isolated_store};
use dedupq_provider::Knobs;
use std::time::Duration;

/// Longer than the test's lease (3 s): the lease must survive it.
const REFUSED_FOR: Duration = Duration::from_secs(12);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_postgres_refuses_connections_is_stored_afterwards_and_only_then_committed(
) {
    let (store, store_settings) = isolated_store().await;
    let role = FaultyRole::create().await;
    let provider = Provider::start(Knobs {
        latency: Duration::from_secs(2),
        ..Knobs::default()
    })
    .await;
    let base = base_config(&role.store_settings(&store_settings), &provider);
    let mut run = KafkaRun::start("noconn", 1, &base).await;

    run.pay(0, TENANT, "pay-0", 0).await;
    charged(&provider, 1).await;
    // The charge is made; its answer comes in 2 s, to a server that lets
    // none of dedupq's sessions in.
    role.refuse_new_sessions().await;
    // The pool only says it timed out; /readyz says why.
    eventually(
        Duration::from_secs(30),
        "/readyz not ready, naming 53300",
        || async {
            let (ok, body) = run.dedupq.readyz().await;
            (!ok && body.contains("53300") && body.contains("too many connections")).then_some(())
        },
    )
    .await;
    run.pay(0, TENANT, "pay-1", 1).await;

    let until = tokio::time::Instant::now() + REFUSED_FOR;
    while tokio::time::Instant::now() < until {
        assert_eq!(
            run.committed().await,
            vec![-1],
            "nothing committed while the outcome is not stored"
        );
        assert_eq!(
            status(&store, "pay-0").await.as_deref(),
            Some("in_progress")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let metrics = run.dedupq.metrics().await;
    let metric = |s: &str| crate::support::process::metric_value(&metrics, s);
    assert_eq!(
        metric("dedupq_dead_letters_total"),
        0.0,
        "nothing dead-lettered"
    );
    assert_eq!(
        metric(r#"dedupq_messages_total{outcome="invalid"}"#),
        0.0,
        "no payment counted invalid"
    );
    assert!(
        metric(r#"dedupq_store_errors_total{class="pool"}"#) > 0.0,
        "statements that found no connection counted under `pool`"
    );
    assert_eq!(
        provider.stats().await.charges,
        1,
        "the payment that arrived meanwhile is not run before it can be claimed"
    );
    assert_eq!(
        role.sessions().await,
        0,
        "no session of the role was let in"
    );

    role.accept_sessions_again().await;
    run.wait_committed_to_end(Duration::from_secs(60)).await;
    for k in ["pay-0", "pay-1"] {
        assert_eq!(status(&store, k).await.as_deref(), Some("done"), "{k}");
        let charges = provider.charges_for(&format!("{TENANT}:{k}")).await;
        assert_eq!(charges.len(), 1, "{k}: one charge");
    }
    assert_eq!(
        provider.stats().await.charges,
        2,
        "one provider charge each"
    );
    run.dedupq
        .wait_ready(Duration::from_secs(20))
        .await
        .expect("ready again once sessions are let in");
    assert_eq!(run.dedupq.metric("dedupq_dead_letters_total").await, 0.0);
    run.dedupq.kill();
    role.drop().await;
}

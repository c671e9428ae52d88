//! PostgreSQL runs out of connections for dedupq's role (SQLSTATE 53300)
//! after the provider charged and before the outcome is stored: every
//! session is cut and no new one is let in. The answer is kept and stored
//! once sessions are let in again; nothing is committed or dead-lettered
//! or acked before that; a payment arriving meanwhile waits and runs once.

use super::common::{
    amqp_charge_answered_during, charged, not_ready_naming, nothing_given_up, run_as, stored_whole,
    TENANT,
};
use crate::support::isolated_store;
use crate::support::pg_faults::{FaultyRole, RoleFault, StoreFault};
use crate::support::process::metric_value;
use std::time::Duration;

/// Longer than the test's lease (3 s): the lease must survive it.
const REFUSED_FOR: Duration = Duration::from_secs(12);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_postgres_refuses_connections_is_stored_afterwards_and_only_then_committed(
) {
    let (store, store_settings) = isolated_store().await;
    let role = FaultyRole::create().await;
    let (provider, mut run) = run_as("noconn", &role, &store_settings).await;

    run.pay(0, TENANT, "pay-0", 0).await;
    charged(&provider, 1).await;
    // The charge is made; its answer comes in 1 s, to a server that lets
    // none of dedupq's sessions in.
    role.refuse_new_sessions().await;
    // The pool only says it timed out; /readyz says why.
    not_ready_naming(&run.dedupq, &["53300", "too many connections"]).await;
    run.pay(0, TENANT, "pay-1", 1).await;

    run.held_uncommitted(&store, "pay-0", REFUSED_FOR).await;
    let metrics = nothing_given_up(&run.dedupq).await;
    assert!(
        metric_value(&metrics, r#"dedupq_store_errors_total{class="pool"}"#) > 0.0,
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
    run.settled_once_each(&store, &provider, &["pay-0", "pay-1"])
        .await;
    for k in ["pay-0", "pay-1"] {
        let charges = provider.charges_for(&format!("{TENANT}:{k}")).await;
        stored_whole(&store, k, &charges[0]).await;
    }
    run.dedupq.kill();
    role.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_a_charge_answered_while_postgres_refuses_connections_is_stored_afterwards_and_only_then_acked(
) {
    amqp_charge_answered_during(StoreFault::Role(RoleFault::NoConnections), REFUSED_FOR).await;
}

//! PostgreSQL fails over to a read-only server (SQLSTATE 25006) after the
//! provider charged and before the outcome is stored. The answer is kept
//! and stored once writes work again; nothing is committed, acked or
//! dead-lettered before that; a payment arriving meanwhile waits and runs
//! once; /readyz says why it is not ready.

use super::common::{
    amqp_charge_answered_during, charged, not_ready_naming, nothing_given_up, run_as, stored_whole,
    TENANT,
};
use crate::support::isolated_store;
use crate::support::pg_faults::{FaultyRole, RoleFault, StoreFault};
use crate::support::process::{metric_value, Dedupq, Provider};
use std::time::Duration;

/// Longer than the test's lease (3 s): the lease must survive it.
const READ_ONLY_FOR: Duration = Duration::from_secs(12);

/// Checks, while the database stays read-only, that nothing was given up.
async fn nothing_given_up_while_read_only(dedupq: &Dedupq, provider: &Provider) {
    let metrics = nothing_given_up(dedupq).await;
    assert!(
        metric_value(&metrics, r#"dedupq_store_errors_total{class="25"}"#) > 0.0,
        "read-only errors counted under class 25"
    );
    assert_eq!(
        provider.stats().await.charges,
        1,
        "the payment that arrived meanwhile is not run before it can be claimed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_postgres_is_read_only_is_stored_afterwards_and_only_then_committed(
) {
    let (store, store_settings) = isolated_store().await;
    let role = FaultyRole::create().await;
    let (provider, mut run) = run_as("readonly", &role, &store_settings).await;

    run.pay(0, TENANT, "pay-0", 0).await;
    charged(&provider, 1).await;
    // The charge is made; its answer comes in 1 s, to a read-only server.
    role.fail_over_to_read_only().await;
    not_ready_naming(&run.dedupq, &["25006"]).await;
    run.pay(0, TENANT, "pay-1", 1).await;

    run.held_uncommitted(&store, "pay-0", READ_ONLY_FOR).await;
    nothing_given_up_while_read_only(&run.dedupq, &provider).await;

    // Writable again for new sessions only: dedupq replaces its own.
    role.writable_again().await;
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
async fn amqp_a_charge_answered_while_postgres_is_read_only_is_stored_afterwards_and_only_then_acked(
) {
    amqp_charge_answered_during(StoreFault::Role(RoleFault::ReadOnly), READ_ONLY_FOR).await;
}

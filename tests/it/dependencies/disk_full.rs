//! PostgreSQL's disk fills up (SQLSTATE 53100) after the provider charged
//! and before the outcome, a long answer that needs new pages, is stored.
//! The answer is kept and stored, whole, once there is room again; nothing
//! is committed, acked or dead-lettered before that; a payment arriving
//! meanwhile is charged at most once.

use super::common::{
    amqp_charge_answered_during, answers_in_1s, charged, not_ready_naming, nothing_given_up,
    stored_whole, KafkaRun, TENANT,
};
use crate::support::isolated_store;
use crate::support::pg_faults::StoreFault;
use crate::support::process::{base_config, metric_value, Provider};
use crate::support::small_disk::SmallDisk;
use std::time::Duration;

/// Longer than the test's lease (3 s): the lease must survive it.
const FULL_FOR: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_postgres_disk_is_full_is_stored_whole_afterwards_and_only_then_committed(
) {
    let (store, store_settings) = isolated_store().await;
    let schema = store_settings.schema.clone().expect("a schema");
    let disk = SmallDisk::mount(16).await;
    disk.take(&schema).await;
    let provider = Provider::start(answers_in_1s()).await;
    let base = base_config(&store_settings, &provider);
    let mut run = KafkaRun::start("diskfull", 1, &base).await;

    run.pay(0, TENANT, "pay-0", 0).await;
    charged(&provider, 1).await;
    // Claimed and charged; its answer comes in 1 s, to a full disk.
    disk.fill();
    not_ready_naming(&run.dedupq, &["53100"]).await;
    run.pay(0, TENANT, "pay-1", 1).await;

    run.held_uncommitted(&store, "pay-0", FULL_FOR).await;
    let metrics = nothing_given_up(&run.dedupq).await;
    assert!(
        metric_value(&metrics, r#"dedupq_store_errors_total{class="53"}"#) > 0.0,
        "out-of-disk errors counted under class 53"
    );

    disk.free();
    run.settled_once_each(&store, &provider, &["pay-0", "pay-1"])
        .await;
    for k in ["pay-0", "pay-1"] {
        let charges = provider.charges_for(&format!("{TENANT}:{k}")).await;
        stored_whole(&store, k, &charges[0]).await;
    }
    run.dedupq.kill();
    drop(store);
    disk.remove(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_a_charge_answered_while_postgres_disk_is_full_is_stored_whole_afterwards_and_only_then_acked(
) {
    amqp_charge_answered_during(StoreFault::DiskFull, FULL_FOR).await;
}

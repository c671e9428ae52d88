//! PostgreSQL's disk fills up (SQLSTATE 53100) after the provider charged
//! and before the outcome, a long answer that needs new pages, is stored.
//! The answer is kept and stored, whole, once there is room again; nothing
//! is committed, acked or dead-lettered before that; a payment arriving
//! meanwhile (its claim may still find room on a page) is charged at most
//! once.

use super::common::{amqp_charge_answered_during, kafka_charge_answered_during};
use crate::support::pg_faults::StoreFault;
use std::time::Duration;

/// Longer than the test's lease (3 s): the lease must survive it.
const FULL_FOR: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_postgres_disk_is_full_is_stored_whole_afterwards_and_only_then_committed(
) {
    kafka_charge_answered_during(StoreFault::DiskFull, FULL_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_a_charge_answered_while_postgres_disk_is_full_is_stored_whole_afterwards_and_only_then_acked(
) {
    amqp_charge_answered_during(StoreFault::DiskFull, FULL_FOR).await;
}

//! PostgreSQL fails over to a read-only server (SQLSTATE 25006) after the
//! provider charged and before the outcome is stored. The answer is kept
//! and stored once writes work again; nothing is committed, acked or
//! dead-lettered before that; a payment arriving meanwhile waits and runs
//! once; /readyz says why it is not ready.

use super::common::{amqp_charge_answered_during, kafka_charge_answered_during};
use crate::support::pg_faults::{RoleFault, StoreFault};
use std::time::Duration;

/// Longer than the test's lease (3 s): the lease must survive it.
const READ_ONLY_FOR: Duration = Duration::from_secs(12);

const READ_ONLY: StoreFault = StoreFault::Role(RoleFault::ReadOnly);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_postgres_is_read_only_is_stored_afterwards_and_only_then_committed(
) {
    kafka_charge_answered_during(READ_ONLY, READ_ONLY_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_a_charge_answered_while_postgres_is_read_only_is_stored_afterwards_and_only_then_acked(
) {
    amqp_charge_answered_during(READ_ONLY, READ_ONLY_FOR).await;
}

//! PostgreSQL runs out of connections for dedupq's role (SQLSTATE 53300)
//! after the provider charged and before the outcome is stored: every
//! session is cut and no new one is let in. The answer is kept and stored
//! once sessions are let in again; nothing is committed or dead-lettered
//! or acked before that; a payment arriving meanwhile waits and runs once.
//! The pool only says it timed out; /readyz says why (53300), and the
//! statements that found no connection are counted under `pool`.

use super::common::{amqp_charge_answered_during, kafka_charge_answered_during};
use crate::support::pg_faults::{RoleFault, StoreFault};
use std::time::Duration;

/// Longer than the test's lease (3 s): the lease must survive it.
const REFUSED_FOR: Duration = Duration::from_secs(12);

const NO_CONNECTIONS: StoreFault = StoreFault::Role(RoleFault::NoConnections);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_postgres_refuses_connections_is_stored_afterwards_and_only_then_committed(
) {
    kafka_charge_answered_during(NO_CONNECTIONS, REFUSED_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_a_charge_answered_while_postgres_refuses_connections_is_stored_afterwards_and_only_then_acked(
) {
    amqp_charge_answered_during(NO_CONNECTIONS, REFUSED_FOR).await;
}

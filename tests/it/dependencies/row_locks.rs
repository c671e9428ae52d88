//! A row locked from another session (an operator's `SELECT … FOR UPDATE`
//! in psql), alone and with a statement timeout on dedupq's role, and the
//! whole key table locked, for writes (`CREATE INDEX` in psql) or
//! exclusively (`VACUUM FULL`, `ALTER TABLE`). dedupq's
//! own `store.lock_timeout` bounds every wait: a locked key waits, its
//! batch and partition go on, and a charged payment's answer is stored
//! once the lock is gone — never dead-lettered.

use super::common::{
    amqp_charge_answered_during, charged, kafka_charge_answered_during, run_as, status, KafkaRun,
    TENANT,
};
use crate::support::kafka;
use crate::support::pg_faults::{charged_once_and_stored_whole, FaultyRole, RowLock, StoreFault};
use crate::support::process::{base_config, Provider};
use crate::support::{eventually, isolated_store};
use dedupq_provider::Knobs;
use std::time::Duration;

const LOCKED_FOR: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_finish_cancelled_by_the_roles_statement_timeout_on_a_locked_row_is_stored_after_the_lock_and_only_then_committed(
) {
    let (store, store_settings) = isolated_store().await;
    let schema = store_settings.schema.clone().expect("test schema");
    let role = FaultyRole::create().await;
    // Shorter than dedupq's lock_timeout (1 s): PostgreSQL cancels the
    // waiting finish (57014) before the lock wait runs out.
    role.statement_timeout(Some(400)).await;
    let (provider, mut run) = run_as("stmt_timeout", &role, &store_settings).await;

    run.pay(0, TENANT, "pay-0", 0).await;
    charged(&provider, 1).await;
    // The answer comes in 1 s; the row is locked from psql before that.
    let lock = RowLock::take(&schema, TENANT, "pay-0").await;
    let until = tokio::time::Instant::now() + LOCKED_FOR;
    while tokio::time::Instant::now() < until {
        assert_eq!(
            run.committed().await,
            vec![-1],
            "nothing committed while the outcome is not stored"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        status(&store, "pay-0").await.as_deref(),
        Some("in_progress")
    );
    assert_eq!(run.dedupq.metric("dedupq_dead_letters_total").await, 0.0);
    lock.release().await;

    run.wait_committed_to_end(Duration::from_secs(60)).await;
    assert_eq!(status(&store, "pay-0").await.as_deref(), Some("done"));
    // The answer received while the row was locked, not a later call's.
    charged_once_and_stored_whole(&store, &provider, TENANT, "pay-0").await;
    assert_eq!(provider.stats().await.charges, 1, "one provider call");
    assert_eq!(run.dedupq.metric("dedupq_dead_letters_total").await, 0.0);
    assert!(
        run.dedupq
            .metric(r#"dedupq_claims_total{result="locked"}"#)
            .await
            > 0.0,
        "the message came back while its row was locked, and waited"
    );
    run.dedupq.kill();
    role.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_row_locked_from_psql_holds_back_its_own_key_and_never_its_batch_or_partition() {
    let (store, store_settings) = isolated_store().await;
    let schema = store_settings.schema.clone().expect("test schema");
    let provider = Provider::start(Knobs::default()).await;
    let base = base_config(&store_settings, &provider);
    let mut run = KafkaRun::start("row_lock", 1, &base).await;

    run.pay(0, TENANT, "locked", 0).await;
    run.wait_committed_to_end(Duration::from_secs(30)).await;

    // An operator inspects the key in psql and leaves the transaction open.
    let lock = RowLock::take(&schema, TENANT, "locked").await;
    // A duplicate of the locked key first, then new payments behind it.
    run.pay(0, TENANT, "locked", 0).await;
    const N: usize = 5;
    for k in 1..=N {
        run.pay(0, TENANT, &format!("pay-{k}"), k).await;
    }
    eventually(
        Duration::from_secs(20),
        "the payments behind the locked key are charged and stored while it stays locked",
        || async {
            for k in 1..=N {
                if status(&store, &format!("pay-{k}")).await.as_deref() != Some("done") {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    // Longer than store.lock_timeout: the locked key keeps waiting alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let end = kafka::end_offsets(&run.topic, 1).await;
    assert!(
        run.committed().await[0] < end[0],
        "the locked key's duplicate is not committed while its row is locked"
    );
    assert!(
        run.dedupq
            .metric(r#"dedupq_claims_total{result="locked"}"#)
            .await
            > 0.0,
        "the locked claim is counted"
    );
    lock.release().await;
    run.wait_committed_to_end(Duration::from_secs(30)).await;
    assert_eq!(
        provider.stats().await.charges,
        N as i64 + 1,
        "one charge per payment"
    );
    run.dedupq.kill();
}

/// Longer than the test's lease (3 s): the lease must survive it.
const TABLE_LOCKED_FOR: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_the_key_table_is_locked_for_writes_from_psql_is_stored_afterwards_and_only_then_committed(
) {
    kafka_charge_answered_during(StoreFault::TableLockedForWrites, TABLE_LOCKED_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_a_charge_answered_while_the_key_table_is_locked_for_writes_from_psql_is_stored_afterwards_and_only_then_acked(
) {
    amqp_charge_answered_during(StoreFault::TableLockedForWrites, TABLE_LOCKED_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_the_key_table_is_locked_exclusively_from_psql_is_stored_afterwards_and_only_then_committed(
) {
    kafka_charge_answered_during(StoreFault::TableLockedExclusively, TABLE_LOCKED_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_a_charge_answered_while_the_key_table_is_locked_exclusively_from_psql_is_stored_afterwards_and_only_then_acked(
) {
    amqp_charge_answered_during(StoreFault::TableLockedExclusively, TABLE_LOCKED_FOR).await;
}

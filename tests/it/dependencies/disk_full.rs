//! PostgreSQL's disk fills up (SQLSTATE 53100) after the provider charged
//! and before the outcome, a long answer that needs new pages, is stored.
//! The answer is kept and stored, whole, once there is room again; nothing
//! is committed or dead-lettered before that; a payment arriving meanwhile
//! is charged at most once.

use super::common::{charged, status, KafkaRun, TENANT};
use crate::support::process::{base_config, Provider};
use crate::support::small_disk::SmallDisk;
use crate::support::{eventually, isolated_store};
use dedupq_provider::Knobs;
use std::time::Duration;

/// Longer than the test's lease (3 s): the lease must survive it.
const FULL_FOR: Duration = Duration::from_secs(10);

/// Bytes of each answer's receipt: more than a page, so that storing it
/// needs pages the key table does not have yet.
const RECEIPT: usize = 16 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_a_charge_answered_while_postgres_disk_is_full_is_stored_whole_afterwards_and_only_then_committed(
) {
    let (store, store_settings) = isolated_store().await;
    let schema = store_settings.schema.clone().expect("a schema");
    let disk = SmallDisk::mount(16).await;
    disk.take(&schema).await;
    let provider = Provider::start(Knobs {
        latency: Duration::from_secs(1),
        answer_padding: RECEIPT,
        ..Knobs::default()
    })
    .await;
    let base = base_config(&store_settings, &provider);
    let mut run = KafkaRun::start("diskfull", 1, &base).await;

    run.pay(0, TENANT, "pay-0", 0).await;
    charged(&provider, 1).await;
    // Claimed and charged; its answer comes in 1 s, to a full disk.
    disk.fill();
    eventually(
        Duration::from_secs(30),
        "/readyz not ready, naming 53100",
        || async {
            let (ok, body) = run.dedupq.readyz().await;
            (!ok && body.contains("53100")).then_some(())
        },
    )
    .await;
    run.pay(0, TENANT, "pay-1", 1).await;

    let until = tokio::time::Instant::now() + FULL_FOR;
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
        metric(r#"dedupq_store_errors_total{class="53"}"#) > 0.0,
        "out-of-disk errors counted under class 53"
    );

    disk.free();
    run.wait_committed_to_end(Duration::from_secs(60)).await;
    for k in ["pay-0", "pay-1"] {
        assert_eq!(status(&store, k).await.as_deref(), Some("done"), "{k}");
        let charges = provider.charges_for(&format!("{TENANT}:{k}")).await;
        assert_eq!(charges.len(), 1, "{k}: one charge");
        let (result, body): (i32, Vec<u8>) = sqlx::query_as(
            "SELECT result_status, result_body FROM dedupq_keys WHERE tenant = $1 AND key = $2",
        )
        .bind(TENANT)
        .bind(k)
        .fetch_one(store.pool())
        .await
        .expect("the stored outcome");
        assert_eq!(result, 201, "{k}");
        let answer: serde_json::Value =
            serde_json::from_slice(&body).expect("the stored answer is the provider's JSON");
        assert_eq!(
            answer["id"],
            format!("ch_{}", charges[0].id),
            "{k}: the charge made"
        );
        assert_eq!(
            answer["receipt"].as_str().map(str::len),
            Some(RECEIPT),
            "{k}: the answer stored whole"
        );
    }
    assert_eq!(
        provider.stats().await.charges,
        2,
        "one provider charge each"
    );
    run.dedupq
        .wait_ready(Duration::from_secs(20))
        .await
        .expect("ready again once there is room");
    run.dedupq.kill();
    drop(store);
    disk.remove(&schema).await;
}

//! The real `dedupq` binary, killed with SIGKILL at the worst moments,
//! against the provider simulator that counts charges.

use super::common::{body, TENANT};
use crate::support::kafka::{self, headers, produce};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq::store::Store;
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

/// `base_config` plus a `[kafka]` section for `topic` and `group`.
fn config(base: &toml::Table, topic: &str, group: &str, commit_interval: &str) -> toml::Table {
    let mut config = kafka::with_kafka(base, topic, group, "");
    config["kafka"]["commit_interval"] = commit_interval.into();
    config
}

async fn rows(store: &Store, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dedupq_keys WHERE status = $1")
        .bind(status)
        .fetch_one(store.pool())
        .await
        .expect("count rows by status")
}

/// Keys with a final stored outcome (done, or failed after the retries);
/// the rest would be `in_progress` or `unknown`.
async fn finished(store: &Store) -> i64 {
    rows(store, "done").await + rows(store, "failed").await
}

async fn send(topic: &str, partitions: i32, n: usize) {
    let producer = kafka::producer();
    for k in 0..n {
        let p = (k as i32) % partitions;
        produce(
            &producer,
            topic,
            p,
            &headers(TENANT, &format!("pay-{k}")),
            &body(k),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_after_the_charge_before_the_result_is_stored_the_retry_charges_nothing_more() {
    let (store, store_settings) = isolated_store().await;
    // The provider charges, then takes 6 s to answer: the kill lands there,
    // however slowly a busy machine lets the six charges and the test's
    // look at them follow each other. The handler's timeout and the lease
    // are longer than that answer.
    let provider = Provider::start(Knobs {
        latency: Duration::from_secs(6),
        ..Knobs::default()
    })
    .await;
    let (topic, _) = kafka::topics("crash1", 2).await;
    let group = unique("g");
    const N: usize = 6;
    send(&topic, 2, N).await;

    let mut config = config(
        &base_config(&store_settings, &provider),
        &topic,
        &group,
        "200ms",
    );
    config["handler"]["timeout"] = "8s".into();
    config["engine"]["lease"] = "10s".into();
    config["engine"]["renew_every"] = "2s".into();
    let mut dedupq = Dedupq::start(&config).await;
    eventually(Duration::from_secs(30), "every payment charged", || async {
        (provider.stats().await.charges == N as i64).then_some(())
    })
    .await;
    dedupq.kill();
    assert_eq!(
        rows(&store, "done").await,
        0,
        "killed before any result was stored"
    );
    assert_eq!(
        kafka::committed(&group, &topic, 2).await,
        vec![-1, -1],
        "nothing committed"
    );

    provider.set_knobs(json!({ "latency": "0s" })).await;
    dedupq.restart().await;
    kafka::wait_committed_to_end(&group, &topic, 2, Duration::from_secs(60)).await;
    let stats = provider.stats().await;
    assert_eq!(stats.charges, N as i64, "exactly one charge per payment");
    assert_eq!(stats.double_charged, 0);
    for k in 0..N {
        let charges = provider.charges_for(&format!("{TENANT}:pay-{k}")).await;
        assert_eq!(
            charges.len(),
            1,
            "pay-{k}: one charge under the derived key"
        );
    }
    assert_eq!(
        finished(&store).await,
        N as i64,
        "one final outcome per payment"
    );
    assert!(
        dedupq.metric("dedupq_lease_takeovers_total").await >= N as f64,
        "the restarted process took the keys over and called the provider again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_after_the_results_are_stored_before_the_commit_the_redeliveries_are_duplicates() {
    let (store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let (topic, _) = kafka::topics("crash2", 2).await;
    let group = unique("g");
    const N: usize = 6;
    send(&topic, 2, N).await;

    // A commit interval of an hour widens the stored-but-not-committed
    // window to the whole first run: only a revoke or a clean shutdown would
    // commit, and SIGKILL allows neither.
    let base = base_config(&store_settings, &provider);
    let mut first = Dedupq::start(&config(&base, &topic, &group, "1h")).await;
    eventually(Duration::from_secs(30), "every result stored", || async {
        (rows(&store, "done").await == N as i64).then_some(())
    })
    .await;
    first.kill();
    assert_eq!(
        kafka::committed(&group, &topic, 2).await,
        vec![-1, -1],
        "nothing committed"
    );

    let second = Dedupq::start(&config(&base, &topic, &group, "200ms")).await;
    kafka::wait_committed_to_end(&group, &topic, 2, Duration::from_secs(60)).await;
    let kafka_outcome =
        |o: &str| format!("dedupq_messages_total{{outcome=\"{o}\",transport=\"kafka\"}}");
    assert_eq!(second.metric(&kafka_outcome("duplicate")).await, N as f64);
    assert_eq!(second.metric(&kafka_outcome("processed")).await, 0.0);
    let stats = provider.stats().await;
    assert_eq!(stats.charges, N as i64, "no second charge");
    assert_eq!(stats.double_charged, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_in_one_group_one_killed_mid_stream_every_payment_charged_once() {
    let (store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs {
        latency: Duration::from_millis(20),
        ..Knobs::default()
    })
    .await;
    let (topic, _) = kafka::topics("crash3", 4).await;
    let group = unique("g");
    let config = config(
        &base_config(&store_settings, &provider),
        &topic,
        &group,
        "200ms",
    );
    let mut a = Dedupq::start(&config).await;
    let b = Dedupq::start(&config).await;

    const N: usize = 160;
    let feed = kafka::paced_payments(&topic, 4, TENANT, N, Duration::from_millis(10), body);
    eventually(Duration::from_secs(60), "a quarter charged", || async {
        (provider.stats().await.charges >= (N / 4) as i64).then_some(())
    })
    .await;
    a.kill();
    feed.await.expect("producer task");

    kafka::wait_committed_to_end(&group, &topic, 4, Duration::from_secs(90)).await;
    provider.charged_once_each(N).await;
    assert_eq!(
        finished(&store).await,
        N as i64,
        "one final outcome per payment"
    );
    assert!(b.metric("dedupq_messages_total{transport=\"kafka\"}").await > 0.0);
}

use super::common::{body, effects, outcomes, produce_payments, TENANT};
use crate::support::handlers::Recording;
use crate::support::kafka::{self, headers, produce, Running};
use crate::support::{engine, fast_options, isolated_store, unique};
use dedupq::health::Component;
use futures::future::join_all;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_of_one_key_spread_over_partitions_and_sent_concurrently_have_one_effect() {
    let (store, _) = isolated_store().await;
    let (topic, _) = kafka::topics("dup", 4).await;
    let group = unique("g");
    let handler = Arc::new(Recording::with_delay(Duration::from_millis(30)));
    let (e1, e2) = (
        engine(&store, handler.clone(), fast_options()),
        engine(&store, handler.clone(), fast_options()),
    );
    let a = Running::start(kafka::settings(&topic, &group), e1.clone());
    let b = Running::start(kafka::settings(&topic, &group), e2.clone());

    // Every key goes to every partition at once; the two members consume
    // different partitions, so the copies race through different batches.
    const KEYS: usize = 25;
    let producer = kafka::producer();
    join_all((0..KEYS).flat_map(|k| {
        let (producer, topic) = (&producer, &topic);
        (0..4).map(move |p| async move {
            produce(
                producer,
                topic,
                p,
                &headers(TENANT, &format!("pay-{k}")),
                &body(k),
            )
            .await
        })
    }))
    .await;

    kafka::wait_committed_to_end(&group, &topic, 4, Duration::from_secs(60)).await;
    let (keys, calls) = effects(&handler.calls());
    assert_eq!(keys, KEYS, "every key reached the handler");
    assert_eq!(calls, KEYS, "one effect per key, however many copies");
    let processed = outcomes(&e1, "processed") + outcomes(&e2, "processed");
    let duplicate = outcomes(&e1, "duplicate") + outcomes(&e2, "duplicate");
    assert_eq!(processed, KEYS as u64);
    assert_eq!(
        duplicate,
        3 * KEYS as u64,
        "the other copies are duplicates"
    );
    // The flag follows librdkafka's broker connections, which a loaded
    // machine can drop and reopen for a moment: it must be up again.
    crate::support::eventually(
        Duration::from_secs(30),
        "member a's Kafka health up",
        || async { (a.health.get(Component::Kafka) == Some(true)).then_some(()) },
    )
    .await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_lag_per_partition_drops_to_zero_once_everything_is_committed() {
    let (store, _) = isolated_store().await;
    let (topic, _) = kafka::topics("lag", 2).await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    let e = engine(&store, handler.clone(), fast_options());
    let producer = kafka::producer();
    for k in 0..10 {
        produce(
            &producer,
            &topic,
            (k % 2) as i32,
            &headers(TENANT, &format!("k{k}")),
            &body(k),
        )
        .await;
    }
    let running = Running::start(kafka::settings(&topic, &group), e.clone());
    kafka::wait_committed_to_end(&group, &topic, 2, Duration::from_secs(30)).await;
    crate::support::eventually(Duration::from_secs(10), "lag gauges at 0", || async {
        let text = e.metrics().render();
        (lag(&text, &topic, 0) == Some(0) && lag(&text, &topic, 1) == Some(0)).then_some(())
    })
    .await;
    assert_eq!(e.metrics().broker_up.with_label_values(&["kafka"]).get(), 1);
    running.stop().await;
}

/// A group that has never committed has no committed offset for
/// librdkafka to subtract from: the lag is still reported, counted from
/// where the member started, while the first messages are in hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_lag_is_reported_before_the_groups_first_commit() {
    let (store, _) = isolated_store().await;
    let (topic, _) = kafka::topics("lag_first", 1).await;
    let group = unique("g");
    // Nothing finishes while the test looks: no offset is ever committed.
    let handler = Arc::new(Recording::with_delay(Duration::from_secs(600)));
    let e = engine(&store, handler.clone(), fast_options());
    let producer = kafka::producer();
    produce_payments(&producer, &topic, 0..12).await;
    let mut settings = kafka::settings(&topic, &group);
    settings.stats_interval = Duration::from_millis(300);
    settings.drain_timeout = Duration::from_millis(500);
    let running = Running::start(settings, e.clone());
    let seen = crate::support::eventually(Duration::from_secs(20), "a lag gauge", || async {
        lag(&e.metrics().render(), &topic, 0).filter(|l| *l > 0)
    })
    .await;
    assert_eq!(seen, 12, "every message waits: none is committed");
    assert!(
        kafka::committed(&group, &topic, 1).await[0] < 0,
        "nothing committed yet"
    );
    drop(running);
}

/// The exported lag series of one partition; None when it was never set.
fn lag(exposition: &str, topic: &str, partition: i32) -> Option<i64> {
    let (t, p) = (
        format!("topic=\"{topic}\""),
        format!("partition=\"{partition}\""),
    );
    exposition
        .lines()
        .filter(|l| l.starts_with("dedupq_kafka_consumer_lag{") && l.contains(&t) && l.contains(&p))
        .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
}

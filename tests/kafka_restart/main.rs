//! The shared Kafka broker stopped for longer than
//! `kafka.restart_after_down` under a live consumer. Its own binary because
//! it stops the shared broker: cargo runs test binaries one at a time.

// Helpers are pub for their sibling modules; a test binary has no API.
#![allow(unreachable_pub)]

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use support::handlers::Recording;
use support::kafka::{self, headers, produce, Running};
use support::outage::Stopped;
use support::{engine, eventually, fast_options, isolated_store, unique};

async fn publish(topic: &str, prefix: &str, n: usize) {
    let producer = kafka::producer();
    for k in 0..n {
        let body = format!(r#"{{"amount":{k},"currency":"EUR"}}"#);
        let key = format!("{prefix}-{k}");
        produce(
            &producer,
            topic,
            (k % 2) as i32,
            &headers("t1", &key),
            body.as_bytes(),
        )
        .await;
    }
}

/// A librdkafka client can stay cut off from its group coordinator after
/// a broker restart (seen in a chaos run: "Waiting for coordinator" for
/// minutes while the group's other members worked). A consumer that
/// reaches no broker for `kafka.restart_after_down` is rebuilt with a new
/// client, and the new one consumes once the broker is back; nothing is
/// lost or run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_that_reaches_no_broker_for_restart_after_down_is_rebuilt_and_consumes_again() {
    let (store, _) = isolated_store().await;
    let (topic, _) = kafka::topics("restart", 2).await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    let e = engine(&store, handler.clone(), fast_options());
    let settings = dedupq::transport::kafka::KafkaSettings {
        restart_after_down: Duration::from_secs(3),
        ..kafka::settings(&topic, &group)
    };
    let running = Running::start(settings, e.clone());
    publish(&topic, "before", 20).await;
    eventually(
        Duration::from_secs(60),
        "the first payments processed",
        || async { (handler.count() >= 20).then_some(()) },
    )
    .await;
    let restarts = &e.metrics().kafka_client_restarts;
    assert_eq!(restarts.get(), 0, "no restart while the broker answers");

    let stopped = Stopped::new("kafka");
    eventually(
        Duration::from_secs(60),
        "the consumer rebuilt with a new client",
        || async { (restarts.get() >= 1).then_some(()) },
    )
    .await;
    drop(stopped);

    publish(&topic, "after", 20).await;
    kafka::wait_committed_to_end(&group, &topic, 2, Duration::from_secs(120)).await;
    let keys: BTreeSet<String> = handler.calls().into_iter().map(|c| c.derived_key).collect();
    assert_eq!(keys.len(), 40, "every payment processed");
    assert_eq!(handler.count(), 40, "each once");
    assert_eq!(support::count_rows(&store).await, 40);
    running.stop().await;
}

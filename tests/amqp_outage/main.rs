//! RabbitMQ force-closes every connection mid-stream. Runs alone: it also
//! cuts the connections of any other test running against the broker.

// Helpers are pub for their sibling modules; a test binary has no API.
#![allow(unreachable_pub)]

#[path = "../support/mod.rs"]
mod support;

use dedupq::transport::amqp::AmqpSettings;
use dedupq::transport::amqp::QueueType;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use support::amqp::{self, Client, Msg, Running};
use support::handlers::Recording;

const MESSAGES: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn closing_all_connections_mid_stream_loses_nothing_and_repeats_no_effect() {
    let (store, _) = support::isolated_store().await;
    // A small window and a slow handler keep deliveries in flight (some
    // mid-handler) whenever the connections are cut.
    let handler = Arc::new(Recording::with_delay(Duration::from_millis(100)));
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let settings = AmqpSettings {
        prefetch: 10,
        max_batches_in_flight: 2,
        ..amqp::settings(QueueType::Quorum)
    };
    let queue = settings.queues[0].clone();
    let client = Client::connect().await;
    // A first run declares the queues; the backlog is published before the
    // consuming run starts, so the stream is still flowing when cut.
    let declaring = Running::start(&settings, &engine);
    wait_until(&handler, 0, &declaring).await;
    declaring.stop().await.expect("clean stop");
    for i in 0..MESSAGES {
        let msg = Msg::new(
            "acme",
            &format!("pay-{i}"),
            &format!(r#"{{"amount": {i}}}"#),
        );
        client.publish(&queue, &msg).await;
    }
    let running = Running::start(&settings, &engine);

    for threshold in [MESSAGES / 5, MESSAGES / 2] {
        wait_until(&handler, threshold, &running).await;
        amqp::close_all_connections();
    }
    let done = || {
        let store = store.clone();
        async move {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM dedupq_keys WHERE status = 'done'")
                    .fetch_one(store.pool())
                    .await
                    .ok()?;
            (n == MESSAGES as i64).then_some(())
        }
    };
    support::eventually(Duration::from_secs(60), "every message processed", done).await;
    running.stop().await.expect("the transport stops cleanly");

    let mut per_key: HashMap<String, usize> = HashMap::new();
    for call in handler.calls() {
        *per_key.entry(call.derived_key).or_default() += 1;
    }
    let repeated: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "second effects: {repeated:?}");
    assert_eq!(per_key.len(), MESSAGES, "every message had its effect");
    let client = Client::connect().await;
    assert_eq!(
        client.ready(&queue).await,
        0,
        "nothing left in the work queue"
    );
    assert_eq!(client.ready(&settings.delay_queue(&queue)).await, 0);
    assert!(client.drain(&settings.dead_letter_queue).await.is_empty());
    // Deliveries whose handler had finished when their connection was cut:
    // their acks were never sent, they came back, and were recognised.
    let replayed = engine
        .metrics()
        .messages
        .with_label_values(&["amqp", "duplicate"])
        .get();
    assert!(replayed >= 1, "the forced closes hit deliveries in flight");
    client.cleanup(&settings).await;
}

/// Waits until the handler ran `n` times and the transport consumes.
async fn wait_until(handler: &Recording, n: usize, running: &Running) {
    use dedupq::health::Component;
    support::eventually(Duration::from_secs(30), "progress", || {
        let ok = handler.count() >= n && running.health.get(Component::Amqp) == Some(true);
        async move { ok.then_some(()) }
    })
    .await;
}

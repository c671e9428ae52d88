use super::Harness;
use crate::support;
use crate::support::amqp::{self, Msg, Running};
use crate::support::handlers::Recording;
use dedupq::health::Component;
use dedupq::transport::amqp::{QueueType, Topology};
use std::time::Duration;

#[tokio::test]
async fn verify_mode_consumes_a_topology_declared_by_someone_else() {
    let declared = Harness::start(QueueType::Classic, Recording::default()).await;
    let settings = declared.settings.clone();
    let client = amqp::Client::connect().await;
    declared.finish_keeping_queues().await;

    let verify = dedupq::transport::amqp::AmqpSettings {
        topology: Topology::Verify,
        ..settings
    };
    let h = Harness::start_with(verify, Recording::default()).await;
    let replies = client.reply_queue().await;
    let msg = Msg::new("acme", "pay-v", r#"{"amount": 3}"#).reply_to(&replies, "v");
    client.publish(h.queue(), &msg).await;
    client
        .expect_exactly(&replies, 1, Duration::from_secs(10))
        .await;
    assert_eq!(h.handler.count(), 1);
    h.finish().await;
}

#[tokio::test]
async fn verify_mode_without_the_queues_stays_unready_and_keeps_retrying() {
    let settings = dedupq::transport::amqp::AmqpSettings {
        topology: Topology::Verify,
        ..amqp::settings(QueueType::Quorum)
    };
    let (store, _) = support::isolated_store().await;
    let engine = support::engine(
        &store,
        std::sync::Arc::new(Recording::default()),
        support::fast_options(),
    );
    let running = Running::start(&settings, &engine);

    let health = running.health.clone();
    support::eventually(Duration::from_secs(10), "a failed verification", || {
        let down = health.get(Component::Amqp) == Some(false);
        async move { down.then_some(()) }
    })
    .await;

    running
        .stop()
        .await
        .expect("a missing queue is not fatal: dedupq waits for it");
}

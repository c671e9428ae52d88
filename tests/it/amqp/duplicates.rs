use super::Harness;
use crate::support::amqp::{Client, Msg};
use crate::support::handlers::Recording;
use dedupq::transport::amqp::QueueType;
use futures::StreamExt;
use std::time::Duration;

const BODY: &str = r#"{"amount": 1250, "currency": "EUR", "recipient": "acct-9"}"#;

async fn five_copies_at_once_have_one_effect(queue_type: QueueType) {
    let h = Harness::start(
        queue_type,
        Recording::with_delay(Duration::from_millis(300)),
    )
    .await;
    let replies = h.client.reply_queue().await;
    let copies =
        (1..=5).map(|i| Msg::new("acme", "pay-5", BODY).reply_to(&replies, &format!("copy-{i}")));
    futures::future::join_all(copies.map(|m| {
        let (client, queue) = (&h.client, h.queue().to_string());
        async move { client.publish(&queue, &m).await }
    }))
    .await;

    let got = h
        .client
        .expect_exactly(&replies, 5, Duration::from_secs(20))
        .await;

    assert_eq!(h.handler.count(), 1, "one effect for five copies");
    let mut correlations: Vec<_> = got
        .iter()
        .filter_map(|g| g.correlation_id.clone())
        .collect();
    correlations.sort();
    assert_eq!(
        correlations,
        ["copy-1", "copy-2", "copy-3", "copy-4", "copy-5"]
    );
    let first = got[0].json();
    assert_eq!(first["body"]["charged"]["amount"], 1250);
    assert_eq!(first["tenant"], "acme");
    assert_eq!(first["key"], "pay-5");
    for g in &got {
        assert_eq!(
            g.json()["body"],
            first["body"],
            "every copy gets the same (stored) result"
        );
        assert_eq!(g.json()["status"], "done");
        assert_eq!(g.header("dedupq-status").as_deref(), Some("done"));
    }
    assert_eq!(h.decided("processed"), 1);
    assert_eq!(h.decided("duplicate"), 4);
    assert!(h
        .client
        .drain(&h.settings.dead_letter_queue)
        .await
        .is_empty());
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_message_published_five_times_at_once_has_one_effect_on_a_quorum_queue() {
    five_copies_at_once_have_one_effect(QueueType::Quorum).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_message_published_five_times_at_once_has_one_effect_on_a_classic_queue() {
    five_copies_at_once_have_one_effect(QueueType::Classic).await;
}

/// The broken variant the test above must catch: a consumer that treats
/// `redelivered=false` as "new" and runs the handler per delivery.
#[tokio::test]
async fn a_consumer_that_trusts_redelivered_false_would_have_five_effects() {
    let client = Client::connect().await;
    let queue = client.reply_queue().await;
    for _ in 0..5 {
        client
            .publish(&queue, &Msg::new("acme", "pay-5", BODY))
            .await;
    }
    let channel = client.connection.create_channel().await.unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let mut effects = 0;
    while effects < 5 {
        let delivery = tokio::time::timeout(Duration::from_secs(5), consumer.next())
            .await
            .expect("a delivery")
            .expect("stream open")
            .expect("delivery");
        if !delivery.redelivered {
            effects += 1;
        }
        delivery.ack(Default::default()).await.unwrap();
    }
    assert_eq!(effects, 5, "every copy arrives with redelivered=false");
}

#[tokio::test]
async fn the_message_id_property_is_the_key_when_the_header_is_absent() {
    let h = Harness::start(QueueType::Classic, Recording::default()).await;
    let replies = h.client.reply_queue().await;
    let msg = Msg {
        key: None,
        message_id: Some("mid-1".into()),
        ..Msg::new("acme", "unused", BODY).reply_to(&replies, "c-1")
    };
    h.client.publish(h.queue(), &msg).await;
    h.client.publish(h.queue(), &msg).await;

    let got = h
        .client
        .expect_exactly(&replies, 2, Duration::from_secs(10))
        .await;

    assert_eq!(h.handler.count(), 1);
    assert_eq!(h.handler.calls()[0].derived_key, "acme:mid-1");
    assert_eq!(
        got[1].header("dedupq-outcome").as_deref(),
        Some("duplicate")
    );
    h.finish().await;
}

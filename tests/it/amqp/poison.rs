use super::Harness;
use crate::support::amqp::Msg;
use crate::support::handlers::Recording;
use dedupq::transport::amqp::QueueType;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_messages_are_dead_lettered_with_their_reason_and_the_consumer_continues() {
    let h = Harness::start(QueueType::Quorum, Recording::default()).await;
    let replies = h.client.reply_queue().await;
    let q = h.queue().to_string();

    h.client
        .publish(&q, &Msg::new("acme", "bad-json", "{not json"))
        .await;
    let no_key = Msg {
        key: None,
        ..Msg::new("acme", "", r#"{"amount": 1}"#)
    };
    h.client.publish(&q, &no_key).await;
    let good = Msg::new("acme", "pay-ok", r#"{"amount": 5}"#).reply_to(&replies, "ok");
    h.client.publish(&q, &good).await;
    h.client
        .expect_exactly(&replies, 1, Duration::from_secs(10))
        .await;
    let reused = Msg::new("acme", "pay-ok", r#"{"amount": 6}"#);
    h.client.publish(&q, &reused).await;

    let dead = h
        .client
        .expect_exactly(&h.settings.dead_letter_queue, 3, Duration::from_secs(10))
        .await;
    let reason = |r: &str| {
        dead.iter()
            .find(|d| d.header("dedupq-reason").as_deref() == Some(r))
            .unwrap_or_else(|| panic!("a dead letter with reason {r}"))
    };
    assert_eq!(reason("not_json").body, b"{not json");
    assert!(reason("bad_key")
        .header("dedupq-detail")
        .unwrap()
        .contains("key"));
    let conflict = reason("conflict");
    assert_eq!(conflict.header("dedupq-key").as_deref(), Some("pay-ok"));
    let fingerprint = conflict.header("dedupq-fingerprint").unwrap();
    assert!(
        fingerprint.starts_with("v2:") && fingerprint.len() == 67,
        "the one text form of a fingerprint, as on Kafka: {fingerprint}"
    );
    for d in &dead {
        assert_eq!(d.header("dedupq-source-queue").as_deref(), Some(q.as_str()));
        assert!(d.header("dedupq-first-seen").is_some());
        assert!(d.header("dedupq-delivery-tag").is_some());
    }
    assert_eq!(h.handler.count(), 1, "only the good message ran");
    assert_eq!(
        crate::support::count_rows(&h.store).await,
        1,
        "poison claims no key"
    );
    h.finish().await;
}

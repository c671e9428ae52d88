//! One key space: a payment seen over HTTP and through a broker, in either
//! order, is one payment.

use super::harness::App;
use crate::support::amqp::{self, Client, Msg};
use crate::support::kafka::{self, headers, produce};
use crate::support::process::Provider;
use crate::support::{eventually, unique};
use dedupq::config::QueueType;
use dedupq_provider::Knobs;
use std::time::Duration;

const BODY: &str = r#"{"amount": 990, "currency": "EUR", "recipient": "acct-7"}"#;

/// Charges every call: a second execution would be a second charge.
fn forgetful() -> Knobs {
    Knobs {
        honour_keys: false,
        ..Knobs::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_paid_over_http_and_then_sent_through_kafka_is_charged_once() {
    paid_over_http_then_sent_through_kafka("pay-x1", "pay-x1").await;
}

/// `key` paid over HTTP, then the same payment produced to Kafka with
/// `on_the_queue` as its key header: decided as a duplicate, one charge.
async fn paid_over_http_then_sent_through_kafka(key: &str, on_the_queue: &str) {
    let provider = Provider::start(forgetful()).await;
    let (topic, _) = kafka::topics("dqt_http", 1).await;
    let app = App::with(&provider, |s, _| {
        s.kafka = kafka::settings(&topic, &unique("g"));
    })
    .await;
    app.wait_ready().await;

    let paid = app.pay(key, BODY).await;
    assert_eq!(paid.status, 201, "{paid:?}");
    produce(
        &kafka::producer(),
        &topic,
        0,
        &headers("acme", on_the_queue),
        BODY.as_bytes(),
    )
    .await;

    eventually(
        Duration::from_secs(30),
        "the Kafka copy decided",
        || async { (app.decided("kafka", "duplicate") == 1).then_some(()) },
    )
    .await;
    assert_eq!(app.decided("kafka", "processed"), 0);
    assert_eq!(provider.stats().await.charges, 1, "one charge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_sent_through_rabbitmq_and_then_over_http_is_charged_once() {
    let provider = Provider::start(forgetful()).await;
    let rabbit = amqp::settings(QueueType::Quorum);
    let app = App::with(&provider, |s, _| s.amqp = rabbit.clone()).await;
    app.wait_ready().await;
    let client = Client::connect().await;

    client
        .publish(&rabbit.queues[0], &Msg::new("acme", "pay-x2", BODY))
        .await;
    eventually(
        Duration::from_secs(30),
        "the RabbitMQ copy processed",
        || async { (app.decided("amqp", "processed") == 1).then_some(()) },
    )
    .await;

    let paid = app.pay("pay-x2", BODY).await;
    assert_eq!((paid.status, paid.replayed()), (201, true), "{paid:?}");
    let charges = provider.charges_for("acme:pay-x2").await;
    assert_eq!(charges.len(), 1);
    assert_eq!(
        paid.json()["id"],
        format!("ch_{}", charges[0].id),
        "the stored charge"
    );
    assert_eq!(provider.stats().await.charges, 1);
    client.cleanup(&rabbit).await;
}

/// An outbox relay that copies the HTTP request's header as it came: a
/// structured-field string (`"pay-x3"`), as the IETF draft defines the
/// header. On the queue it is the same key as the bare one over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_sent_quoted_through_kafka_is_the_same_key_as_the_bare_one_over_http() {
    paid_over_http_then_sent_through_kafka("pay-x3", "\"pay-x3\"").await;
}

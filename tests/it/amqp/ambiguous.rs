//! Identity that could be read two ways. A repeated JSON member is
//! refused on RabbitMQ as on Kafka. A header table is a map once the client
//! library has parsed it: headers whose names differ only in case are two
//! entries and dedupq refuses them, but two entries with the very same
//! name collapse to the last one before dedupq sees the delivery.

use super::Harness;
use crate::support::amqp::{self, Msg};
use crate::support::handlers::Recording;
use crate::support::raw_amqp::{publish_raw, FieldValue, RawProperties};
use dedupq::transport::amqp::QueueType;
use std::time::Duration;

fn text(v: &str) -> FieldValue {
    FieldValue::LongStr(v.as_bytes().to_vec())
}

async fn publish(h: &Harness, headers: Vec<(&str, &str)>, body: &[u8]) {
    let properties = RawProperties {
        headers: Some(
            headers
                .into_iter()
                .map(|(n, v)| (n.as_bytes().to_vec(), text(v)))
                .collect(),
        ),
        ..RawProperties::default()
    };
    publish_raw(&amqp::amqp_url(), h.queue(), &properties, body)
        .await
        .expect("raw publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identity_headers_differing_in_case_and_repeated_json_members_are_dead_lettered() {
    let h = Harness::start(QueueType::Quorum, Recording::default()).await;
    let replies = h.client.reply_queue().await;
    publish(
        &h,
        vec![
            ("client-id", "acme"),
            ("idempotency-key", "a"),
            ("Idempotency-Key", "b"),
        ],
        br#"{"amount": 1}"#,
    )
    .await;
    publish(
        &h,
        vec![
            ("Client-Id", "mallory"),
            ("client-id", "acme"),
            ("idempotency-key", "c"),
        ],
        br#"{"amount": 2}"#,
    )
    .await;
    publish(
        &h,
        vec![("client-id", "acme"), ("idempotency-key", "d")],
        br#"{"amount":1,"amount":100000}"#,
    )
    .await;
    let q = h.queue().to_string();
    h.client
        .publish(
            &q,
            &Msg::new("acme", "ok", r#"{"amount": 4}"#).reply_to(&replies, "ok"),
        )
        .await;
    h.client
        .expect_exactly(&replies, 1, Duration::from_secs(10))
        .await;

    let dead = h
        .client
        .expect_exactly(&h.settings.dead_letter_queue, 3, Duration::from_secs(10))
        .await;
    let mut reasons: Vec<(String, String)> = dead
        .iter()
        .map(|d| {
            (
                d.header("dedupq-reason").unwrap_or_default(),
                d.header("dedupq-detail").unwrap_or_default(),
            )
        })
        .collect();
    reasons.sort();
    assert_eq!(reasons[0].0, "duplicate_header");
    assert_eq!(reasons[1].0, "duplicate_header");
    let details = format!("{} {}", reasons[0].1, reasons[1].1);
    assert!(
        details.contains("client-id") && details.contains("idempotency-key"),
        "{details}"
    );
    assert_eq!(reasons[2].0, "duplicate_member");
    assert_eq!(h.handler.count(), 1, "only the unambiguous payment ran");
    assert_eq!(crate::support::count_rows(&h.store).await, 1);
    h.finish().await;
}

/// The limit, stated as a test: RabbitMQ delivers both entries of a
/// repeated name (the raw reader sees them), lapin's map keeps the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_header_name_repeated_exactly_reaches_dedupq_as_its_last_value_only() {
    let h = Harness::start(QueueType::Quorum, Recording::default()).await;
    publish(
        &h,
        vec![
            ("client-id", "acme"),
            ("idempotency-key", "first"),
            ("idempotency-key", "last"),
        ],
        br#"{"amount": 1}"#,
    )
    .await;
    crate::support::eventually(Duration::from_secs(10), "the payment ran", || {
        let n = h.handler.count();
        async move { (n == 1).then_some(()) }
    })
    .await;
    assert_eq!(h.handler.calls()[0].derived_key, "acme:last");
    assert_eq!(h.client.ready(&h.settings.dead_letter_queue).await, 0);
    h.finish().await;
}

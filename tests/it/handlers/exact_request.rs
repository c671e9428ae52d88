//! The body was changed on the way: the forwarder re-serialised the parsed
//! JSON (`10.000000000000001` became `10.0`, integers past u64 floats, `-0`
//! `-0.0`, keys reordered). The provider must receive the message's bytes
//! exactly, with its content type, through Kafka and RabbitMQ, while the
//! fingerprint stays canonical (a reordered, re-spaced copy is a
//! duplicate). The simulator compares bytes and records what it received.

use crate::support::http_handler;
use crate::support::payments::{amqp::AmqpPayments, KafkaPayments, Setup};
use crate::support::process::Provider;
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HttpHandler, Request};
use dedupq::store::KeyStatus;
use dedupq_provider::{Charge, Compare, Knobs};
use std::time::Duration;

const BODY: &[u8] = br#"{"z":1,  "amount":10.000000000000001, "big":18446744073709551616,
 "neg":-0, "e":1e1, "nested":{"b":2,"a":[1.50,-0.0]}}"#;
/// The same payment as BODY, written by another JSON library.
const SAME_CANONICAL: &[u8] = br#"{"amount":10.000000000000001,"big":18446744073709551616,"e":1e1,"nested":{"a":[1.50,-0.0],"b":2},"neg":-0,"z":1}"#;

/// How what the provider received differs from what was sent.
fn altered(sent: &[u8], content_type: &str, charge: &Charge) -> Vec<String> {
    let mut out = Vec::new();
    if charge.request.as_bytes() != sent {
        out.push(format!("body arrived as {}", charge.request));
    }
    if charge.content_type.as_deref() != Some(content_type) {
        out.push(format!("content type arrived as {:?}", charge.content_type));
    }
    out
}

async fn provider() -> Provider {
    Provider::start(Knobs {
        compare: Compare::Bytes,
        ..Knobs::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_kafka_the_provider_receives_the_exact_bytes_and_content_type() {
    let provider = provider().await;
    let handler = http_handler(&provider.charges_url(), Duration::from_secs(5));
    let pipeline = KafkaPayments::start(Setup::new(handler)).await;
    let content_type = "application/json; charset=utf-8";

    pipeline
        .send(
            "exact-k",
            BODY,
            &[("content-type", content_type.as_bytes())],
        )
        .await;
    pipeline.wait_status("exact-k", KeyStatus::Done).await;
    pipeline.send("exact-k", SAME_CANONICAL, &[]).await;
    pipeline.wait_committed().await;

    let charges = provider.charges_for("acme:exact-k").await;
    assert_eq!(charges.len(), 1);
    assert_eq!(
        altered(BODY, content_type, &charges[0]),
        Vec::<String>::new()
    );
    assert_eq!(
        pipeline.outcomes("duplicate"),
        1,
        "the fingerprint is canonical"
    );
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_rabbitmq_the_provider_receives_the_exact_bytes_and_content_type() {
    let provider = provider().await;
    let handler = http_handler(&provider.charges_url(), Duration::from_secs(5));
    let pipeline = AmqpPayments::start(Setup::new(handler)).await;
    let content_type = "application/vnd.acme.payment+json";

    pipeline.send("exact-a", BODY, Some(content_type)).await;
    pipeline.wait_status("exact-a", KeyStatus::Done).await;
    pipeline.send("exact-a", SAME_CANONICAL, None).await;
    pipeline.wait_outcomes(&["duplicate"], 1).await;

    let charges = provider.charges_for("acme:exact-a").await;
    assert_eq!(charges.len(), 1);
    assert_eq!(
        altered(BODY, content_type, &charges[0]),
        Vec::<String>::new()
    );
    pipeline.stop().await;
}

/// The forwarder before the fix: it parses the body and writes it again.
struct ReSerialising(HttpHandler);

#[async_trait::async_trait]
impl Handler for ReSerialising {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        let value: serde_json::Value = call.json().unwrap_or_default();
        let body = serde_json::to_vec(&value).unwrap_or_default();
        let call = HandlerCall {
            request: Request {
                body: &body,
                content_type: Some("application/json"),
            },
            ..*call
        };
        self.0.handle(&call).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarder_that_re_serialises_the_json_is_caught_changing_the_body() {
    let provider = provider().await;
    let handler = http_handler(&provider.charges_url(), Duration::from_secs(5));
    let pipeline = KafkaPayments::start(Setup::new(ReSerialising(handler))).await;
    let content_type = "application/json; charset=utf-8";

    pipeline
        .send(
            "exact-r",
            BODY,
            &[("content-type", content_type.as_bytes())],
        )
        .await;
    pipeline.wait_status("exact-r", KeyStatus::Done).await;

    let charges = provider.charges_for("acme:exact-r").await;
    let found = altered(BODY, content_type, &charges[0]);
    assert_eq!(found.len(), 2, "{found:?}");
    pipeline.stop().await;
}

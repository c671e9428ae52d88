//! Fact (c): a poison drags the other unacked deliveries of its connection
//! to the delivery limit with it.
//!
//! - With prefetch N > 1, the broker sends the poison together with the
//!   messages around it. When lapin drops the connection, every delivery
//!   of that connection not yet acked is returned and counted: the ones
//!   the application held (a batch in progress) and the ones sent after
//!   the poison that lapin never parsed. Each session fails the same way,
//!   so after L + 1 sessions RabbitMQ dead-letters the innocent messages
//!   in the window too, with the same `delivery_limit` reason.
//! - With prefetch 1 (and each delivery acked before the next), the
//!   poison is alone in flight: only it is counted and dead-lettered; the
//!   messages before it are processed once and the ones after it arrive
//!   with `x-delivery-count = 0` once it is gone.

use super::raw_amqp_publish::hostile_properties;
use super::topology::{consume_session, death_reason, is_parsing_error, Limited, Session};
use crate::support::amqp::{amqp_url, Client, Msg};
use crate::support::raw_amqp::publish_raw;
use lapin::types::AMQPValue;
use std::time::Duration;

/// Publishes innocent `a`, `b`, the poison, innocent `c`, `d`.
async fn around_a_poison(client: &Client, queue: &str) {
    for key in ["a", "b"] {
        client.publish(queue, &Msg::new("acme", key, "{}")).await;
    }
    publish_raw(&amqp_url(), queue, &hostile_properties(), b"{}")
        .await
        .expect("publish the poison");
    for key in ["c", "d"] {
        client.publish(queue, &Msg::new("acme", key, "{}")).await;
    }
}

fn key_of(d: &lapin::message::Delivery) -> String {
    let headers = d.properties.headers().as_ref().expect("headers");
    match headers.inner().get("idempotency-key") {
        Some(AMQPValue::LongString(k)) => String::from_utf8_lossy(k.as_bytes()).into_owned(),
        other => panic!("no key: {other:?}"),
    }
}

/// Earlier returns of this delivery: RabbitMQ leaves the header out of a
/// consumer's first delivery.
fn delivery_count(d: &lapin::message::Delivery) -> i64 {
    let headers = d.properties.headers().as_ref().expect("headers");
    match headers.inner().get("x-delivery-count") {
        None => 0,
        Some(AMQPValue::LongLongInt(n)) => *n,
        Some(other) => panic!("x-delivery-count is {other:?}"),
    }
}

fn seen(session: &Session) -> Vec<(String, i64)> {
    session
        .received
        .iter()
        .map(|d| (key_of(d), delivery_count(d)))
        .collect()
}

#[tokio::test]
async fn with_prefetch_above_one_the_unacked_innocent_messages_are_dead_lettered_with_the_poison() {
    let client = Client::connect().await;
    let limit = 2;
    let queues = Limited::declare(&client, limit).await;
    around_a_poison(&client, &queues.work).await;

    let mut failed_sessions = Vec::new();
    loop {
        // A batch in progress: nothing acked when the connection dies.
        let session = consume_session(&queues.work, 10, false, Duration::from_secs(2)).await;
        match &session.error {
            Some(e) if is_parsing_error(e) => failed_sessions.push(seen(&session)),
            _ => break,
        }
        assert!(
            failed_sessions.len() <= 10,
            "the poison was never dead-lettered"
        );
    }

    // The application got `a` and `b` in every session (and would have
    // processed them), each time with a count one higher; `c` and `d`,
    // sent after the poison, never reached it.
    let expected: Vec<Vec<(String, i64)>> = (0..=i64::from(limit))
        .map(|n| vec![("a".into(), n), ("b".into(), n)])
        .collect();
    assert_eq!(failed_sessions, expected);
    assert_eq!(
        client.ready(&queues.work).await,
        0,
        "nothing left to process"
    );
    let dead = queues.dead_lettered().await;
    assert_eq!(dead.len(), 5, "the poison and all four innocent messages");
    for d in &dead {
        assert_eq!(
            death_reason(&d.properties).as_deref(),
            Some(&b"delivery_limit"[..])
        );
    }
}

#[tokio::test]
async fn with_prefetch_one_only_the_poison_is_dead_lettered_and_the_others_are_processed_once() {
    let client = Client::connect().await;
    let limit = 2;
    let queues = Limited::declare(&client, limit).await;
    around_a_poison(&client, &queues.work).await;

    let mut failed = 0;
    let mut processed = Vec::new();
    loop {
        // Each delivery acked before the next is sent.
        let session = consume_session(&queues.work, 1, true, Duration::from_secs(2)).await;
        processed.extend(seen(&session));
        match session.error {
            Some(e) if is_parsing_error(&e) => failed += 1,
            _ => break,
        }
        assert!(failed <= 10, "the poison was never dead-lettered");
    }

    assert_eq!(failed, limit as usize + 1);
    let keys: Vec<&str> = processed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        ["a", "b", "c", "d"],
        "each innocent message once, in order"
    );
    assert!(
        processed.iter().all(|(_, count)| *count == 0),
        "no innocent message was returned: {processed:?}"
    );
    let dead = queues.dead_lettered().await;
    assert_eq!(dead.len(), 1, "only the poison");
    assert_eq!(
        dead[0].properties.message_id,
        hostile_properties().message_id
    );
}

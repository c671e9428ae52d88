//! Fact (b): RabbitMQ 3.10 quorum queues count a delivery lapin cannot
//! parse, and dead-letter it themselves.
//!
//! - Every *return* of a delivery to a quorum queue raises its delivery
//!   count by one, whatever the cause: `basic.reject`/`basic.nack` with
//!   requeue, the channel closed with the delivery unacked, the connection
//!   closed, the TCP socket dropped (which is what lapin does on a frame
//!   it cannot parse), a management-API peek. The `x-delivery-count`
//!   header a delivery carries is the number of earlier returns (left out
//!   of a consumer's first delivery; `basic.get` shows 0). A requeued
//!   delivery goes straight back to a live consumer: a reject-with-requeue
//!   loop counts as fast as it spins.
//! - With `x-delivery-limit = L`, the return that takes the count past L
//!   dead-letters the message instead: it is delivered L + 1 times in all.
//!   With `x-dead-letter-exchange` (and `x-dead-letter-strategy =
//!   at-least-once`, `x-overflow = reject-publish`) it is re-published to
//!   that exchange with its original routing key, its properties byte for
//!   byte (non-UTF-8 ones included), and an `x-death` header whose first
//!   entry has `reason = delivery_limit`, `queue = <work queue>` and
//!   `count = 1`.
//! - A quorum queue without `x-delivery-limit` (3.10 has no default) never
//!   gives up: the poison fails every session.

use super::raw_amqp_publish::hostile_properties;
use super::topology::{
    consume_session, death_reason, is_parsing_error, open_consumer, quorum_queue, take_all,
    Consuming, Limited,
};
use crate::support::amqp::{amqp_url, Client, Msg};
use crate::support::raw_amqp::{self, publish_raw, FieldValue, RawProperties};
use futures::StreamExt;
use lapin::options::{BasicCancelOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable};
use std::time::Duration;

/// Consumer sessions until one yields no parsing error for `quiet`, at
/// most `max`; returns how many failed.
async fn failing_sessions(queue: &str, max: usize) -> usize {
    let mut failed = 0;
    while failed < max {
        let session = consume_session(queue, 1, false, Duration::from_secs(2)).await;
        match session.error {
            Some(e) if is_parsing_error(&e) => failed += 1,
            Some(e) => panic!("a session failed otherwise: {e}"),
            None => break,
        }
    }
    failed
}

#[tokio::test]
async fn a_delivery_lapin_cannot_parse_is_dead_lettered_by_the_broker_after_limit_plus_one_sessions(
) {
    let client = Client::connect().await;
    let limit = 3;
    let queues = Limited::declare(&client, limit).await;
    publish_raw(
        &amqp_url(),
        &queues.work,
        &hostile_properties(),
        b"{\"amount\":1}",
    )
    .await
    .expect("publish the poison");

    let failed = failing_sessions(&queues.work, 10).await;

    assert_eq!(
        failed,
        limit as usize + 1,
        "each failed session counted once"
    );
    assert_eq!(client.ready(&queues.work).await, 0);
    let dead = queues.dead_lettered().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        death_reason(&dead[0].properties).as_deref(),
        Some(&b"delivery_limit"[..])
    );
    assert_eq!(dead[0].routing_key, queues.work.as_bytes());
    assert_eq!(
        dead[0].properties.message_id,
        hostile_properties().message_id
    );
    assert_eq!(dead[0].body, b"{\"amount\":1}");
}

/// The broken variant: without the limit nothing ends the loop.
#[tokio::test]
async fn without_a_delivery_limit_the_poison_fails_every_session_and_nothing_is_dead_lettered() {
    let client = Client::connect().await;
    let queue = quorum_queue(&client, "unlimited", FieldTable::default()).await;
    publish_raw(&amqp_url(), &queue, &hostile_properties(), b"{}")
        .await
        .expect("publish the poison");

    let failed = failing_sessions(&queue, 8).await;

    assert_eq!(failed, 8, "still failing after 8 sessions");
    let left = take_all(&queue).await;
    assert_eq!(left.len(), 1);
    assert_eq!(
        left[0].properties.header(b"x-delivery-count"),
        Some(&FieldValue::Long(8))
    );
}

/// Delivers the head of `queue` to a lapin consumer and ends that
/// delivery's life in the way named by `cause`.
async fn deliver_and_return(queue: &str, cause: &str) {
    if cause == "socket dropped" {
        let mut raw = raw_amqp::connect(&amqp_url()).await.expect("raw connect");
        raw.get_unacked(queue)
            .await
            .expect("get")
            .expect("a message");
        drop(raw);
        return;
    }
    let Consuming {
        connection,
        channel,
        mut consumer,
        ..
    } = open_consumer(queue, 1).await;
    let delivery = consumer.next().await.expect("a delivery").expect("parsed");
    // Otherwise a requeued delivery comes straight back to this consumer
    // and the close returns it a second time.
    channel
        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await
        .expect("cancel");
    let sent = match cause {
        "reject with requeue" => delivery
            .acker
            .reject(BasicRejectOptions { requeue: true })
            .await
            .expect("reject"),
        "nack with requeue" => delivery
            .acker
            .nack(BasicNackOptions {
                requeue: true,
                multiple: false,
            })
            .await
            .expect("nack"),
        "channel closed" => channel.close(200, "done".into()).await.is_ok(),
        "connection closed" => true,
        other => panic!("unknown cause {other}"),
    };
    assert!(sent, "{cause}: sent to the broker");
    connection.close(200, "done".into()).await.expect("close");
}

async fn delivery_count_after(client: &Client, cause: &str) -> Option<FieldValue> {
    let mut args = FieldTable::default();
    args.insert("x-delivery-limit".into(), AMQPValue::LongInt(10));
    let queue = quorum_queue(client, "count", args).await;
    if cause == "parse failure in lapin" {
        let poison = RawProperties {
            message_id: Some(b"\xff".to_vec()),
            ..RawProperties::default()
        };
        publish_raw(&amqp_url(), &queue, &poison, b"{}")
            .await
            .expect("publish");
        let session = consume_session(&queue, 1, false, Duration::from_secs(2)).await;
        assert!(session.error.is_some_and(|e| is_parsing_error(&e)));
    } else {
        client.publish(&queue, &Msg::new("acme", "k-1", "{}")).await;
        if cause != "never delivered" {
            deliver_and_return(&queue, cause).await;
        }
    }
    // The broker returns an unacked delivery once it has noticed the
    // connection or channel closed: on a busy machine, not at once.
    let back = crate::support::eventually(
        Duration::from_secs(30),
        &format!("{cause}: the message is back"),
        || async {
            let back = take_all(&queue).await;
            (!back.is_empty()).then_some(back)
        },
    )
    .await;
    assert_eq!(back.len(), 1, "{cause}: the message is back once");
    back[0].properties.header(b"x-delivery-count").cloned()
}

#[tokio::test]
async fn every_return_of_a_delivery_to_a_quorum_queue_counts_toward_the_limit() {
    let client = Client::connect().await;
    let mut seen = Vec::new();
    for cause in [
        "never delivered",
        "reject with requeue",
        "nack with requeue",
        "channel closed",
        "connection closed",
        "socket dropped",
        "parse failure in lapin",
    ] {
        seen.push((cause, delivery_count_after(&client, cause).await));
    }

    let one = Some(FieldValue::Long(1));
    assert_eq!(
        seen,
        [
            ("never delivered", Some(FieldValue::Long(0))),
            ("reject with requeue", one.clone()),
            ("nack with requeue", one.clone()),
            ("channel closed", one.clone()),
            ("connection closed", one.clone()),
            ("socket dropped", one.clone()),
            ("parse failure in lapin", one),
        ]
    );
}

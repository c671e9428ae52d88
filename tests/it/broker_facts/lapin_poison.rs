//! Fact (a): what a lapin 4.12 consumer does with a delivery whose
//! properties are not UTF-8 (RabbitMQ 3.10, quorum queue).
//!
//! - The consumer stream yields one `Err` whose kind is
//!   `ErrorKind::ParsingError` (amq-protocol's shortstr parser refuses the
//!   bytes; a non-UTF-8 `message_id` and a non-UTF-8 header *name* fail
//!   alike), then ends (`None`). The delivery never reaches the application:
//!   there is no delivery tag to ack, reject or dead-letter.
//! - The error is connection-wide: `Connection::events_listener` yields
//!   `Event::Error` with the same parsing error, the connection reports
//!   `errored()`, every channel is no longer `connected()`, and opening a
//!   channel fails. lapin drops the TCP socket without `connection.close`
//!   (RabbitMQ logs "client unexpectedly closed TCP connection").
//! - `Connection::close` on that connection returns at once with
//!   `InvalidConnectionState` (it does not hang).
//! - The delivery goes back to the queue (`redelivered`, and on a quorum
//!   queue its `x-delivery-count` rises by one): it comes back to the next
//!   session first, forever, unless the queue has a delivery limit.

use super::raw_amqp_publish::hostile_properties;
use super::topology::{is_parsing_error, open_consumer, quorum_queue, Consuming};
use crate::support::amqp::{amqp_url, Client};
use crate::support::raw_amqp::{self, publish_raw, FieldValue, RawProperties};
use futures::StreamExt;
use lapin::types::FieldTable;
use lapin::{ErrorKind, Event};
use std::time::{Duration, Instant};

/// What one lapin session saw of the message at the head of a queue.
#[derive(Debug)]
struct Seen {
    stream_failed_with_parsing_error: bool,
    stream_ended: bool,
    connection_event_was_parsing_error: bool,
    connection_errored: bool,
    channel_connected: bool,
    new_channel_refused: bool,
    close_refused_quickly: bool,
}

async fn receive_with_lapin(queue: &str) -> Seen {
    let Consuming {
        connection,
        mut events,
        channel,
        mut consumer,
    } = open_consumer(queue, 1).await;
    let within = Duration::from_secs(5);
    let first = tokio::time::timeout(within, consumer.next()).await;
    let stream_failed_with_parsing_error =
        matches!(&first, Ok(Some(Err(e))) if is_parsing_error(e));
    let then = tokio::time::timeout(Duration::from_secs(1), consumer.next()).await;
    // Skips `Connected`, which may come first.
    let error_event = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(event) = events.next().await {
            if let Event::Error(e) = event {
                return Some(e);
            }
        }
        None
    })
    .await;
    let connection_errored = connection.status().errored();
    let channel_connected = channel.status().connected();
    let new_channel_refused = connection.create_channel().await.is_err();
    let started = Instant::now();
    let close = connection.close(200, "done".into()).await;
    Seen {
        stream_failed_with_parsing_error,
        stream_ended: matches!(then, Ok(None)),
        connection_event_was_parsing_error: matches!(
            error_event,
            Ok(Some(e)) if is_parsing_error(&e)
        ),
        connection_errored,
        channel_connected,
        new_channel_refused,
        close_refused_quickly: matches!(
            close,
            Err(e) if matches!(e.kind(), ErrorKind::InvalidConnectionState(_))
        ) && started.elapsed() < Duration::from_secs(1),
    }
}

fn only_message_id_bad() -> RawProperties {
    RawProperties {
        message_id: Some(b"\xff\xfeid".to_vec()),
        ..RawProperties::default()
    }
}

fn only_a_header_name_bad() -> RawProperties {
    RawProperties {
        headers: Some(vec![(
            b"\xff\xfeidempotency-key".to_vec(),
            FieldValue::LongStr(b"k-1".to_vec()),
        )]),
        ..RawProperties::default()
    }
}

#[tokio::test]
async fn a_lapin_consumer_sent_non_utf8_properties_gets_a_parsing_error_and_loses_its_whole_connection(
) {
    let client = Client::connect().await;
    for (case, props) in [
        ("message_id", only_message_id_bad()),
        ("header name", only_a_header_name_bad()),
        ("every string", hostile_properties()),
    ] {
        let queue = quorum_queue(&client, "lapin_poison", FieldTable::default()).await;
        publish_raw(&amqp_url(), &queue, &props, b"{}")
            .await
            .expect("publish");

        let seen = receive_with_lapin(&queue).await;

        assert!(seen.stream_failed_with_parsing_error, "{case}: {seen:?}");
        assert!(seen.stream_ended, "{case}: {seen:?}");
        assert!(seen.connection_event_was_parsing_error, "{case}: {seen:?}");
        assert!(
            seen.connection_errored && !seen.channel_connected,
            "{case}: {seen:?}"
        );
        assert!(seen.new_channel_refused, "{case}: {seen:?}");
        assert!(seen.close_refused_quickly, "{case}: {seen:?}");
        let mut raw = raw_amqp::connect(&amqp_url()).await.expect("raw connect");
        let back = raw
            .get(&queue)
            .await
            .expect("get")
            .expect("the message is back");
        assert!(back.redelivered, "{case}");
        assert_eq!(
            back.properties.header(b"x-delivery-count"),
            Some(&FieldValue::Long(1)),
            "{case}: the failed session counted as one delivery"
        );
        raw.close().await.expect("close");
    }
}

/// The checks above must be able to fail: the same shape of message with
/// valid UTF-8 reaches the application and leaves the connection healthy.
#[tokio::test]
async fn the_same_message_with_valid_utf8_is_delivered_and_the_connection_stays_up() {
    let client = Client::connect().await;
    let queue = quorum_queue(&client, "lapin_fine", FieldTable::default()).await;
    let props = RawProperties {
        message_id: Some("\u{FFFD}\u{FFFD}id".as_bytes().to_vec()),
        headers: Some(vec![(
            "\u{FFFD}\u{FFFD}idempotency-key".as_bytes().to_vec(),
            FieldValue::LongStr(b"k-1".to_vec()),
        )]),
        ..RawProperties::default()
    };
    publish_raw(&amqp_url(), &queue, &props, b"{}")
        .await
        .expect("publish");

    let seen = receive_with_lapin(&queue).await;

    assert!(!seen.stream_failed_with_parsing_error, "{seen:?}");
    assert!(
        !seen.connection_errored && seen.channel_connected,
        "{seen:?}"
    );
    assert!(!seen.new_channel_refused, "{seen:?}");
}

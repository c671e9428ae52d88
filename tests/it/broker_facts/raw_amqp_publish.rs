use super::topology::quorum_queue;
use crate::support::amqp::{amqp_url, Client, Msg};
use crate::support::rabbit_management::peek;
use crate::support::raw_amqp::{self, publish_raw, FieldValue, RawAmqpError, RawProperties};
use crate::support::unique;
use lapin::types::FieldTable;

/// Properties no client library would send: every string is invalid UTF-8.
pub fn hostile_properties() -> RawProperties {
    RawProperties {
        message_id: Some(b"\xff\xfeid".to_vec()),
        correlation_id: Some(b"corr-\xc3\x28".to_vec()),
        reply_to: Some(b"reply-\x80".to_vec()),
        content_type: Some(b"application/json; x=\xfe".to_vec()),
        kind: Some(b"\xf0\x28\x8c\x28".to_vec()),
        delivery_mode: Some(2),
        headers: Some(vec![
            (
                b"\xff\xfeidempotency-key".to_vec(),
                FieldValue::LongStr(b"k-1".to_vec()),
            ),
            (
                b"client-id".to_vec(),
                FieldValue::LongStr(b"acme\xff".to_vec()),
            ),
            (
                b"idempotency-key".to_vec(),
                FieldValue::LongStr(b"k-1".to_vec()),
            ),
            (
                b"idempotency-key".to_vec(),
                FieldValue::LongStr(b"k-2".to_vec()),
            ),
        ]),
        ..RawProperties::default()
    }
}

/// `props` without the header a quorum queue adds on a redelivery, and
/// with the headers sorted by name: when RabbitMQ adds that header it
/// re-encodes the table sorted by name (bytes), keeping duplicates in
/// their order.
fn comparable(mut props: RawProperties) -> RawProperties {
    if let Some(h) = props.headers.as_mut() {
        h.retain(|(k, _)| k != b"x-delivery-count");
        h.sort_by(|a, b| a.0.cmp(&b.0));
    }
    props
}

#[tokio::test]
async fn rabbitmq_stores_a_raw_publish_with_non_utf8_properties_and_header_names_byte_exact() {
    let client = Client::connect().await;
    let queue = quorum_queue(&client, "raw", FieldTable::default()).await;
    let props = hostile_properties();
    // Larger than RabbitMQ's frame_max (128 KiB): the body spans frames.
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();

    publish_raw(&amqp_url(), &queue, &props, &body)
        .await
        .expect("published and confirmed");

    let shown = &peek(&queue, 1).await[0];
    assert_eq!(shown["payload_bytes"], 300_000);
    assert_eq!(shown["properties"]["message_id"], "\u{FFFD}\u{FFFD}id");
    let headers = &shown["properties"]["headers"];
    assert_eq!(headers["\u{FFFD}\u{FFFD}idempotency-key"], "k-1");
    assert_eq!(headers["client-id"], "Not UTF-8, base64 is: YWNtZf8=");
    let mut raw = raw_amqp::connect(&amqp_url()).await.expect("connect");
    let got = raw
        .get(&queue)
        .await
        .expect("basic.get")
        .expect("the message is there");
    assert_eq!(
        got.properties.header(b"x-delivery-count"),
        Some(&FieldValue::Long(1)),
        "the management API's look was a delivery"
    );
    assert_eq!(
        comparable(got.properties),
        comparable(props),
        "every property byte-exact, duplicate headers kept in order"
    );
    assert!(got.body == body, "the body came back byte-exact");
    assert!(raw.get(&queue).await.expect("basic.get").is_none());
    raw.close().await.expect("close");
}

/// The byte-exact check must tell the bytes apart: the closest message a
/// client library can send (text: the lossy conversion of the same bytes)
/// looks the same in the management API but not through `basic.get`.
#[tokio::test]
async fn a_lossy_utf8_copy_sent_through_lapin_is_told_apart_from_the_raw_bytes() {
    let client = Client::connect().await;
    let queue = quorum_queue(&client, "lossy", FieldTable::default()).await;
    let lossy = String::from_utf8_lossy(b"\xff\xfeid").into_owned();
    let msg = Msg {
        message_id: Some(lossy),
        ..Msg::new("acme", "k-1", "{}")
    };

    client.publish(&queue, &msg).await;

    assert_eq!(
        peek(&queue, 1).await[0]["properties"]["message_id"],
        "\u{FFFD}\u{FFFD}id"
    );
    let mut raw = raw_amqp::connect(&amqp_url()).await.expect("connect");
    let got = raw
        .get(&queue)
        .await
        .expect("basic.get")
        .expect("the message");
    assert_ne!(
        got.properties.message_id.as_deref(),
        Some(&b"\xff\xfeid"[..])
    );
    raw.close().await.expect("close");
}

#[tokio::test]
async fn a_raw_publish_that_no_queue_takes_is_an_error_not_a_silent_drop() {
    let missing = unique("dqt_facts_missing");

    let result = publish_raw(&amqp_url(), &missing, &hostile_properties(), b"{}").await;

    assert!(
        matches!(result, Err(RawAmqpError::Unroutable { code: 312, .. })),
        "{result:?}"
    );
}

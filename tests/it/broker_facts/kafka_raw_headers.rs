use crate::support::kafka::{self, create_topic};
use crate::support::kafka_raw::{produce_raw, read_raw};
use crate::support::unique;
use std::time::Duration;

#[tokio::test]
async fn a_record_with_non_utf8_header_names_null_values_and_duplicates_round_trips_byte_exact() {
    let topic = unique("raw_headers");
    create_topic(&topic, 1).await;
    let headers: [(&[u8], Option<&[u8]>); 5] = [
        (b"\xff\xfeid", Some(b"\x00\x01\xff")),
        (b"client-id", Some(b"acme")),
        (b"\xff\xfeid", None),
        (b"idempotency-key", Some(b"")),
        (b"\xc3\x28", Some(b"not utf-8 either: \xc3\x28")),
    ];

    let (partition, offset) = produce_raw(
        &topic,
        Some(0),
        Some(b"\x80key"),
        b"{\"amount\":1}",
        &headers,
    )
    .await;
    let records = read_raw(&topic, 1, 1, Duration::from_secs(20)).await;

    assert_eq!((partition, offset), (0, 0));
    let got = &records[0];
    assert_eq!(got.offset, offset);
    assert_eq!(got.key.as_deref(), Some(&b"\x80key"[..]));
    assert_eq!(got.payload.as_deref(), Some(&b"{\"amount\":1}"[..]));
    let expected: Vec<_> = headers
        .iter()
        .map(|(n, v)| (n.to_vec(), v.map(<[u8]>::to_vec)))
        .collect();
    assert_eq!(got.headers, expected);
}

/// The reason the raw reader exists: rdkafka's own header iteration
/// panics on such a record (rdkafka 0.39 unwraps `CStr::to_str()`).
#[tokio::test]
async fn rdkafkas_safe_header_iteration_panics_on_a_non_utf8_header_name() {
    let topic = unique("raw_headers_panic");
    create_topic(&topic, 1).await;
    produce_raw(&topic, None, None, b"{}", &[(b"\xff\xfeid", Some(b"x"))]).await;
    let owned = kafka::read(&topic, 1, 1, Duration::from_secs(20)).await;

    let iterate = std::panic::catch_unwind(|| {
        use rdkafka::message::{Headers, Message};
        owned[0].headers().map(|h| h.iter().count())
    });

    assert!(iterate.is_err(), "rdkafka read the name without panicking");
}

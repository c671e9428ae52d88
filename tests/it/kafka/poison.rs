//! Records no well-behaved producer sends: a header name that is not
//! UTF-8, identity headers given twice, JSON with a repeated member. Each
//! is dead-lettered with its reason, and the payments around it go
//! through.

use super::common::{body, raw_header_str, TENANT};
use crate::support::handlers::Recording;
use crate::support::kafka::{self, Running};
use crate::support::kafka_raw::{produce_raw, read_raw};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{engine, fast_options, isolated_store, unique};
use dedupq::transport::envelope::header as h;
use dedupq_provider::Knobs;
use std::sync::Arc;
use std::time::Duration;

const BAD_NAME: &[u8] = b"x-trace-\xff\xfe";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_with_a_non_utf8_header_name_is_dead_lettered_and_the_payment_behind_it_is_charged_once(
) {
    let (store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let (topic, dlq) = kafka::topics("badname", 1).await;
    let group = unique("g");
    let poison_body = body(1);
    let (_, poison_offset) = produce_raw(
        &topic,
        Some(0),
        Some(b"k-poison"),
        &poison_body,
        &[
            (b"client-id", Some(TENANT.as_bytes())),
            (b"idempotency-key", Some(b"poison-1")),
            (BAD_NAME, Some(b"v")),
        ],
    )
    .await;
    produce_raw(
        &topic,
        Some(0),
        None,
        &body(2),
        &[
            (b"client-id", Some(TENANT.as_bytes())),
            (b"idempotency-key", Some(b"pay-2")),
        ],
    )
    .await;

    let config = kafka::with_kafka(&base_config(&store_settings, &provider), &topic, &group, "");
    let mut dedupq = Dedupq::start(&config).await;
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(60)).await;

    let dead = read_raw(&dlq, 1, 1, Duration::from_secs(10)).await;
    let d = &dead[0];
    assert_eq!(raw_header_str(d, h::REASON), "bad_header");
    assert_eq!(
        raw_header_str(d, h::SOURCE_OFFSET),
        poison_offset.to_string()
    );
    assert!(
        d.headers
            .iter()
            .any(|(n, v)| n.as_slice() == BAD_NAME && v.as_deref() == Some(&b"v"[..])),
        "the original header is kept byte for byte: {:?}",
        d.headers
    );
    assert_eq!(d.payload.as_deref(), Some(poison_body.as_slice()));
    assert_eq!(d.key.as_deref(), Some(&b"k-poison"[..]));

    assert_eq!(
        provider.charges_for(&format!("{TENANT}:pay-2")).await.len(),
        1
    );
    assert_eq!(
        provider.stats().await.charges,
        1,
        "the poison charged nothing"
    );
    assert_eq!(
        dedupq
            .metric(r#"dedupq_dead_letters_total{reason="bad_header"}"#)
            .await,
        1.0
    );
    assert_eq!(
        crate::support::count_rows(&store).await,
        1,
        "the poison claimed no key"
    );
    assert!(
        dedupq.alive(),
        "the process never exits:\n{}",
        dedupq.log_tail()
    );
    assert!(!dedupq.log().contains("panicked"), "{}", dedupq.log_tail());
}

/// Produces a payment whose headers are given as raw pairs.
async fn produce_with(topic: &str, payload: &[u8], headers: &[(&[u8], &[u8])]) -> i64 {
    let headers: Vec<(&[u8], Option<&[u8]>)> =
        headers.iter().map(|(n, v)| (*n, Some(*v))).collect();
    produce_raw(topic, Some(0), None, payload, &headers).await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identity_given_twice_or_a_repeated_json_member_is_dead_lettered_with_its_reason() {
    let (store, _) = isolated_store().await;
    let (topic, dlq) = kafka::topics("ambiguous", 1).await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    let t = TENANT.as_bytes();
    let two_keys = produce_with(
        &topic,
        &body(1),
        &[
            (b"client-id", t),
            (b"idempotency-key", b"a"),
            (b"Idempotency-Key", b"b"),
        ],
    )
    .await;
    let two_tenants = produce_with(
        &topic,
        &body(2),
        &[
            (b"client-id", b"mallory"),
            (b"client-id", t),
            (b"idempotency-key", b"c"),
        ],
    )
    .await;
    let repeated = produce_with(
        &topic,
        br#"{"amount":1,"amount":100000}"#,
        &[(b"client-id", t), (b"idempotency-key", b"d")],
    )
    .await;
    produce_with(
        &topic,
        &body(4),
        &[(b"client-id", t), (b"idempotency-key", b"ok")],
    )
    .await;

    let running = Running::start(
        kafka::settings(&topic, &group),
        engine(&store, handler.clone(), fast_options()),
    );
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(30)).await;
    let dead = read_raw(&dlq, 1, 3, Duration::from_secs(10)).await;
    let reason_at = |offset: i64| {
        let d = dead
            .iter()
            .find(|d| raw_header_str(d, h::SOURCE_OFFSET) == offset.to_string())
            .unwrap_or_else(|| panic!("a dead letter for offset {offset}"));
        (raw_header_str(d, h::REASON), raw_header_str(d, h::DETAIL))
    };
    let (reason, detail) = reason_at(two_keys);
    assert_eq!(reason, "duplicate_header");
    assert!(detail.contains("idempotency-key"), "{detail}");
    let (reason, detail) = reason_at(two_tenants);
    assert_eq!(reason, "duplicate_header");
    assert!(detail.contains("client-id"), "{detail}");
    assert_eq!(reason_at(repeated).0, "duplicate_member");
    assert_eq!(handler.count(), 1, "only the unambiguous payment ran");
    assert_eq!(
        crate::support::count_rows(&store).await,
        1,
        "no key claimed for the rest"
    );
    running.stop().await;
}

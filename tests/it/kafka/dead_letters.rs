use super::common::{body, produce_payments, TENANT};
use crate::support::handlers::Recording;
use crate::support::kafka::{self, header_str, headers, produce, Running};
use crate::support::{engine, fast_options, isolated_store, unique};
use dedupq::transport::envelope::header as h;
use rdkafka::message::Message;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_non_json_message_in_the_middle_of_a_partition_is_dead_lettered_and_the_partition_keeps_flowing(
) {
    let (store, _) = isolated_store().await;
    let (topic, dlq) = kafka::topics("bad", 1).await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    let producer = kafka::producer();
    produce_payments(&producer, &topic, 0..5).await;
    let mut bad_headers = headers(TENANT, "bad-1");
    bad_headers.push(("trace-id".into(), b"abc".to_vec()));
    let bad_offset = produce(&producer, &topic, 0, &bad_headers, b"amount=12 EUR").await;
    produce_payments(&producer, &topic, 5..10).await;

    let running = Running::start(
        kafka::settings(&topic, &group),
        engine(&store, handler.clone(), fast_options()),
    );
    let end = kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(30)).await;
    assert_eq!(end, vec![11]);
    assert_eq!(
        handler.count(),
        10,
        "every valid message after the bad one ran"
    );

    let dead = kafka::read(&dlq, 1, 1, Duration::from_secs(10)).await;
    let d = &dead[0];
    assert_eq!(header_str(d, h::REASON), "not_json");
    assert!(header_str(d, h::DETAIL).contains("not JSON"));
    assert_eq!(header_str(d, h::OUTCOME), "invalid");
    assert_eq!(header_str(d, h::SOURCE_TOPIC), topic);
    assert_eq!(header_str(d, h::SOURCE_PARTITION), "0");
    assert_eq!(header_str(d, h::SOURCE_OFFSET), bad_offset.to_string());
    assert!(chrono::DateTime::parse_from_rfc3339(&header_str(d, h::FIRST_SEEN)).is_ok());
    assert_eq!(d.payload(), Some(&b"amount=12 EUR"[..]), "original payload");
    assert_eq!(
        header_str(d, "idempotency-key"),
        "bad-1",
        "original headers"
    );
    assert_eq!(header_str(d, "trace-id"), "abc");
    assert_eq!(
        crate::support::count_rows(&store).await,
        10,
        "bad input claims no key"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_reused_for_a_different_payment_is_dead_lettered_as_a_conflict_with_its_identity() {
    let (store, _) = isolated_store().await;
    let (topic, dlq) = kafka::topics("conflict", 1).await;
    let group = unique("g");
    let handler = Arc::new(Recording::default());
    let producer = kafka::producer();
    produce(&producer, &topic, 0, &headers(TENANT, "same"), &body(1)).await;
    produce(&producer, &topic, 0, &headers(TENANT, "same"), &body(2)).await;

    let running = Running::start(
        kafka::settings(&topic, &group),
        engine(&store, handler.clone(), fast_options()),
    );
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(30)).await;
    assert_eq!(handler.count(), 1);
    let dead = kafka::read(&dlq, 1, 1, Duration::from_secs(10)).await;
    let d = &dead[0];
    assert_eq!(header_str(d, h::REASON), "conflict");
    assert_eq!(header_str(d, h::TENANT), TENANT);
    assert_eq!(header_str(d, h::KEY), "same");
    assert!(header_str(d, h::FINGERPRINT).starts_with('v'));
    assert_eq!(
        header_str(d, h::SOURCE_OFFSET),
        "1",
        "the second use is the conflict"
    );
    assert_eq!(d.payload(), Some(body(2).as_slice()));
    running.stop().await;
}

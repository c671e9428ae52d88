//! Retries and takeovers sent another copy's body: a copy re-published
//! with another `sent_at` (a field the fingerprint excludes) took the key
//! over and sent its own bytes, which a provider comparing bodies refuses
//! with 422. Every retry and takeover must send the first attempt's exact
//! request, with the same derived key. The simulator compares bytes.

use crate::support::kafka;
use crate::support::payments::{
    identity, kafka_process_config, KafkaPayments, Setup, TENANT, WAIT,
};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, http_handler, isolated_store, unique};
use dedupq::engine::Outcome;
use dedupq::store::{KeyRow, KeyStatus, Store};
use dedupq_provider::{Compare, Knobs};
use std::time::Duration;

const FIRST: &[u8] = br#"{"amount":900,"currency":"EUR","sent_at":"2026-05-01T10:00:00Z"}"#;
const LATER: &[u8] = br#"{"amount":900,"currency":"EUR","sent_at":"2026-05-01T10:07:00Z"}"#;

fn setup(provider: &Provider) -> Setup {
    let mut setup = Setup::new(http_handler(
        &provider.charges_url(),
        Duration::from_secs(5),
    ));
    setup.max_attempts = 8;
    setup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_triggered_by_a_later_copy_sends_the_first_copys_bytes() {
    let provider = Provider::start(Knobs {
        compare: Compare::Bytes,
        fail_next: 1,
        ..Knobs::default()
    })
    .await;
    let (store, store_settings) = isolated_store().await;
    let first = crate::support::engine(
        &store,
        std::sync::Arc::new(http_handler(
            &provider.charges_url(),
            Duration::from_secs(5),
        )),
        crate::support::fast_options(),
    );
    let decided = first
        .process(&[crate::support::message(
            TENANT,
            "retry-1",
            std::str::from_utf8(FIRST).unwrap(),
        )])
        .await
        .unwrap();
    assert_eq!(decided[0].outcome, Outcome::Retried, "503: released");

    let pipeline = KafkaPayments::start_on(store, store_settings, setup(&provider)).await;
    pipeline.send("retry-1", LATER, &[]).await;
    pipeline.wait_status("retry-1", KeyStatus::Done).await;

    let charges = provider.charges_for("acme:retry-1").await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].request.as_bytes(), FIRST);
    pipeline.stop().await;
}

/// A `dedupq run` killed with SIGKILL right after the provider charged
/// the first copy; a later copy arrives through another topic and takes
/// the key over once the dead worker's lease is over. Returns the row the
/// takeover left.
async fn takeover_by_a_later_copy(forget_first_request: bool) -> (KeyRow, Provider, Store) {
    let provider = Provider::start(Knobs {
        compare: Compare::Bytes,
        slow_after_charge: Duration::from_secs(2),
        slow_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let (store, store_settings) = isolated_store().await;
    let (topic, _) = kafka::topics("first", 1).await;
    let base = base_config(&store_settings, &provider);
    let mut dying = Dedupq::start(&kafka_process_config(&base, &topic, &unique("g"))).await;
    kafka::produce(
        &kafka::producer(),
        &topic,
        0,
        &kafka::headers(TENANT, "taken-1"),
        FIRST,
    )
    .await;
    eventually(WAIT, "the provider charged", || async {
        (!provider.charges_for("acme:taken-1").await.is_empty()).then_some(())
    })
    .await;
    dying.kill();
    let row = store.show_key(&identity("taken-1")).await.unwrap().unwrap();
    assert_eq!(row.status, KeyStatus::InProgress, "killed mid-call");
    if forget_first_request {
        sqlx::query("UPDATE dedupq_keys SET request_body = NULL, derived_key = NULL")
            .execute(store.pool())
            .await
            .unwrap();
    }

    let pipeline = KafkaPayments::start_on(store.clone(), store_settings, setup(&provider)).await;
    pipeline.send("taken-1", LATER, &[]).await;
    let row = pipeline
        .wait_row("taken-1", "the takeover settled or held the key", |r| {
            r.status == KeyStatus::Done || r.lease_until.is_none()
        })
        .await;
    pipeline.stop().await;
    (row, provider, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_by_a_later_copy_after_a_crash_sends_the_first_request_and_gets_its_charge() {
    let (row, provider, _store) = takeover_by_a_later_copy(false).await;

    assert_eq!(row.status, KeyStatus::Done, "{row:?}");
    let charges = provider.charges_for("acme:taken-1").await;
    assert_eq!(charges.len(), 1, "the same derived key: no second charge");
    assert_eq!(charges[0].request.as_bytes(), FIRST);
    let result: serde_json::Value =
        serde_json::from_str(row.result_body.as_ref().expect("a result").get()).unwrap();
    assert_eq!(result["id"], format!("ch_{}", charges[0].id), "its charge");
}

/// A store that does not keep the first request (rows written before it
/// did): the takeover sends the later copy, the provider refuses it with
/// 422, and the charged payment never settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_that_sends_the_later_copy_is_caught_by_the_providers_422() {
    let (row, provider, _store) = takeover_by_a_later_copy(true).await;

    assert_ne!(row.status, KeyStatus::Done);
    assert!(
        row.last_error.as_deref().is_some_and(|e| e.contains("422")),
        "{row:?}"
    );
    assert_eq!(provider.charges_for("acme:taken-1").await.len(), 1);
}

//! `handler.lookup_url`: for a key whose earlier attempt may have charged,
//! the provider is asked first. A found charge settles the key `done` with
//! it and no POST is sent; no charge found, and the POST is sent again.
//! The first attempt runs on an engine of its own; the retry arrives
//! through RabbitMQ.

use crate::support::payments::{amqp::AmqpPayments, identity, Setup, TENANT, WAIT};
use crate::support::process::Provider;
use crate::support::{eventually, isolated_store};
use dedupq::config::HandlerSettings;
use dedupq::engine::Outcome;
use dedupq::handler::HttpHandler;
use dedupq::provider::Knobs;
use dedupq::store::{KeyStatus, Store};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const BODY: &str = r#"{"amount":510,"currency":"EUR"}"#;

fn handler(provider: &Provider, lookup: bool) -> HttpHandler {
    HttpHandler::new(&HandlerSettings {
        url: provider.charges_url(),
        timeout: Duration::from_millis(700),
        lookup_url: lookup.then(|| format!("{}/charges/lookup?key={{derived_key}}", provider.base)),
        ..HandlerSettings::default()
    })
    .unwrap()
}

/// The first attempt of `key`: sent, never answered; its outcome unknown.
async fn first_attempt_unknown(store: &Store, provider: &Provider, key: &str) {
    let engine = crate::support::engine(
        store,
        Arc::new(handler(provider, true)),
        crate::support::fast_options(),
    );
    let d = engine
        .process(&[crate::support::message(TENANT, key, BODY)])
        .await
        .unwrap();
    assert_eq!(d[0].outcome, Outcome::Unknown);
}

/// POSTs the provider will still answer 503: it counts them down.
async fn posts_left(provider: &Provider) -> u64 {
    let knobs: serde_json::Value = reqwest::get(format!("{}/admin/knobs", provider.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    knobs["fail_next"].as_u64().unwrap()
}

/// A charge made by an attempt that never got its answer, completed by
/// the provider; from now on every POST is answered 503 (and counted).
async fn charged_without_an_answer(lookup: bool) -> (AmqpPayments, Provider) {
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let (store, _) = isolated_store().await;
    first_attempt_unknown(&store, &provider, "look-1").await;
    eventually(WAIT, "the provider completed the charge", || async {
        let charges = provider.charges_for("acme:look-1").await;
        (charges.len() == 1 && charges[0].state == "succeeded").then_some(())
    })
    .await;
    provider.set_knobs(json!({"fail_next": 100})).await;
    let pipeline = AmqpPayments::start_on(store, Setup::new(handler(&provider, lookup))).await;
    pipeline.send("look-1", BODY.as_bytes(), None).await;
    (pipeline, provider)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_found_by_the_lookup_settles_the_key_done_without_a_second_post() {
    let (pipeline, provider) = charged_without_an_answer(true).await;

    let row = pipeline.wait_status("look-1", KeyStatus::Done).await;

    let charges = provider.charges_for("acme:look-1").await;
    assert_eq!(charges.len(), 1);
    let result: serde_json::Value =
        serde_json::from_str(row.result_body.as_ref().expect("a result").get()).unwrap();
    assert_eq!(result["id"], format!("ch_{}", charges[0].id));
    assert_eq!(posts_left(&provider).await, 100, "no POST was sent");
    pipeline.stop().await;
}

/// Without the lookup the retry is a POST, here answered 503: the test
/// sees it, and the key stays unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lookup_the_retry_is_caught_posting_again() {
    let (pipeline, provider) = charged_without_an_answer(false).await;

    eventually(WAIT, "a POST was sent", || async {
        (posts_left(&provider).await < 100).then_some(())
    })
    .await;
    let row = pipeline.store.show_key(&identity("look-1")).await.unwrap();
    assert_ne!(row.map(|r| r.status), Some(KeyStatus::Done));
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_lookup_finds_no_charge_the_request_is_sent_again_and_charges_once() {
    let provider = Provider::start(Knobs {
        hang_before_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let (store, _) = isolated_store().await;
    first_attempt_unknown(&store, &provider, "look-2").await;
    assert_eq!(provider.stats().await.charges, 0, "nothing charged");

    let pipeline = AmqpPayments::start_on(store, Setup::new(handler(&provider, true))).await;
    pipeline.send("look-2", BODY.as_bytes(), None).await;
    let row = pipeline.wait_status("look-2", KeyStatus::Done).await;

    let charges = provider.charges_for("acme:look-2").await;
    assert_eq!(charges.len(), 1, "the POST was sent again");
    assert_eq!(row.result_status, Some(201), "a fresh charge");
    pipeline.stop().await;
}

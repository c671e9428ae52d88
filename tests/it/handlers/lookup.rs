//! `handler.lookup_url`: for a key whose earlier attempt may have charged,
//! the provider is asked first. A found charge settles the key `done` with
//! it and no POST is sent; no charge found, and the POST is sent again.
//! A 200 that does not name the derived key (a lookup URL one path segment
//! off, answering 200 for every key) settles nothing, nor does a found
//! charge too long to store (`handler.max_response_bytes`). The first attempt
//! runs on an engine of its own; the retry arrives through RabbitMQ.

use crate::support::payments::{amqp::AmqpPayments, identity, Setup, TENANT, WAIT};
use crate::support::process::Provider;
use crate::support::{eventually, isolated_store};
use dedupq::config::HandlerSettings;
use dedupq::engine::Outcome;
use dedupq::handler::HttpHandler;
use dedupq::store::{KeyStatus, Store};
use dedupq_provider::Knobs;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BODY: &str = r#"{"amount":510,"currency":"EUR"}"#;

/// The simulator's lookup of one charge by key.
fn simulator_lookup(provider: &Provider) -> String {
    format!("{}/charges/lookup?key={{derived_key}}", provider.base)
}

fn settings(provider: &Provider, lookup_url: Option<String>) -> HandlerSettings {
    HandlerSettings {
        url: provider.charges_url(),
        timeout: Duration::from_millis(700),
        lookup_url,
        ..HandlerSettings::default()
    }
}

fn handler(provider: &Provider, lookup_url: Option<String>) -> HttpHandler {
    HttpHandler::new(&settings(provider, lookup_url)).unwrap()
}

/// The first attempt of `key`: sent, never answered; its outcome unknown.
async fn first_attempt_unknown(store: &Store, provider: &Provider, key: &str) {
    let engine = crate::support::engine(
        store,
        Arc::new(handler(provider, Some(simulator_lookup(provider)))),
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
/// The retry runs with the handler `retry_with` makes.
async fn charged_without_an_answer(
    retry_with: impl FnOnce(&Provider) -> HttpHandler,
) -> (AmqpPayments, Provider) {
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
    let handler = retry_with(&provider);
    let pipeline = AmqpPayments::start_on(store, Setup::new(handler)).await;
    pipeline.send("look-1", BODY.as_bytes(), None).await;
    (pipeline, provider)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_found_by_the_lookup_settles_the_key_done_without_a_second_post() {
    let (pipeline, provider) =
        charged_without_an_answer(|p| handler(p, Some(simulator_lookup(p)))).await;

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
    let (pipeline, provider) = charged_without_an_answer(|p| handler(p, None)).await;
    posted_again_and_not_settled(&pipeline, &provider).await;
    pipeline.stop().await;
}

/// Waits for the retry's POST; the key is not settled `done`.
async fn posted_again_and_not_settled(pipeline: &AmqpPayments, provider: &Provider) {
    eventually(WAIT, "a POST was sent", || async {
        (posts_left(provider).await < 100).then_some(())
    })
    .await;
    let row = pipeline.store.show_key(&identity("look-1")).await.unwrap();
    assert_ne!(row.map(|r| r.status), Some(KeyStatus::Done));
}

/// A found charge whose answer is longer than `handler.max_response_bytes`
/// could not be stored, so it settles nothing: the retry is a POST, here
/// answered 503, and the key stays unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_answer_too_long_to_store_settles_nothing_and_the_request_is_sent_again() {
    let (pipeline, provider) = charged_without_an_answer(|p| {
        HttpHandler::new(&HandlerSettings {
            // Shorter than any charge the simulator describes.
            max_response_bytes: 32,
            ..settings(p, Some(simulator_lookup(p)))
        })
        .unwrap()
    })
    .await;
    posted_again_and_not_settled(&pipeline, &provider).await;
    assert_eq!(provider.charges_for("acme:look-1").await.len(), 1);
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

    let handler = handler(&provider, Some(simulator_lookup(&provider)));
    let pipeline = AmqpPayments::start_on(store, Setup::new(handler)).await;
    pipeline.send("look-2", BODY.as_bytes(), None).await;
    let row = pipeline.wait_status("look-2", KeyStatus::Done).await;

    let charges = provider.charges_for("acme:look-2").await;
    assert_eq!(charges.len(), 1, "the POST was sent again");
    assert_eq!(row.result_status, Some(201), "a fresh charge");
    pipeline.stop().await;
}

/// A lookup answering 200 with an empty listing for every key, as the
/// simulator's `GET /charges` does; it notes the keys it was asked for.
struct EveryKeyFound {
    url: String,
    asked: Arc<Mutex<Vec<String>>>,
}

impl EveryKeyFound {
    async fn start() -> Self {
        use axum::extract::{Query, State};
        use std::collections::HashMap;
        let asked = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route(
                "/charges",
                axum::routing::get(
                    |State(asked): State<Arc<Mutex<Vec<String>>>>,
                     Query(q): Query<HashMap<String, String>>| async move {
                        asked.lock().unwrap().extend(q.get("key").cloned());
                        axum::Json(json!({"count": 0, "charges": []}))
                    },
                ),
            )
            .with_state(asked.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/charges?key={{derived_key}}",
            listener.local_addr().unwrap()
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, asked }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_answer_that_does_not_name_the_key_settles_nothing_and_the_request_is_sent_again()
{
    let provider = Provider::start(Knobs {
        hang_before_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let (store, _) = isolated_store().await;
    first_attempt_unknown(&store, &provider, "look-3").await;
    assert_eq!(provider.stats().await.charges, 0, "nothing charged");
    let lookup = EveryKeyFound::start().await;

    let handler = handler(&provider, Some(lookup.url.clone()));
    let pipeline = AmqpPayments::start_on(store, Setup::new(handler)).await;
    pipeline.send("look-3", BODY.as_bytes(), None).await;
    let row = pipeline.wait_status("look-3", KeyStatus::Done).await;

    let asked = lookup.asked();
    assert!(
        !asked.is_empty() && asked.iter().all(|k| k == "acme:look-3"),
        "the lookup was asked for the derived key: {asked:?}"
    );
    let charges = provider.charges_for("acme:look-3").await;
    assert_eq!(
        charges.len(),
        1,
        "the POST was sent again, and charged once"
    );
    assert_eq!(
        charges[0].idempotency_key.as_deref(),
        Some("acme:look-3"),
        "with the same derived key"
    );
    assert_eq!(
        row.result_status,
        Some(201),
        "settled by the charge's answer"
    );
    pipeline.stop().await;
}

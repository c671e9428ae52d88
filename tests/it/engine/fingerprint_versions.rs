//! The fingerprint's numbers were inexact: `10` and `10.0` conflicted (a JS
//! producer and a Jackson one on the same payment), while two different
//! large amounts collided as a duplicate. Version 2 compares numbers by
//! exact decimal value; rows stored under version 1 still compare as
//! version 1. Through RabbitMQ, with the provider simulator.

use crate::support::http_handler;
use crate::support::payments::{amqp::AmqpPayments, Setup};
use crate::support::process::Provider;
use crate::support::{self, isolated_store};
use dedupq::config::IdentitySettings;
use dedupq::engine::{Engine, EngineOptions, Outcome, Parser};
use dedupq::fingerprint::FingerprintSpec;
use dedupq::metrics::Metrics;
use dedupq::store::Store;
use dedupq_provider::Knobs;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One amount written three ways, then two amounts that differ only past
/// what an f64 holds (both read as 1e20 through a float).
const MESSAGES: [(&str, &str); 5] = [
    ("ten", r#"{"amount":10,"currency":"EUR"}"#),
    ("ten", r#"{"amount":10.0,"currency":"EUR"}"#),
    ("ten", r#"{"amount":1e1,"currency":"EUR"}"#),
    (
        "big",
        r#"{"amount":100000000000000000001,"currency":"EUR"}"#,
    ),
    (
        "big",
        r#"{"amount":100000000000000000002,"currency":"EUR"}"#,
    ),
];

fn identity_with(version: i16) -> IdentitySettings {
    IdentitySettings {
        fingerprint: FingerprintSpec {
            version,
            ..FingerprintSpec::default()
        },
        ..IdentitySettings::default()
    }
}

/// The keys dead-lettered as conflicts, and the number of duplicates.
async fn judge(version: i16) -> (Vec<String>, u64) {
    let provider = Provider::start(Knobs::default()).await;
    let mut setup = Setup::new(http_handler(
        &provider.charges_url(),
        Duration::from_secs(5),
    ));
    setup.identity = identity_with(version);
    let pipeline = AmqpPayments::start(setup).await;
    for (key, body) in MESSAGES {
        pipeline.send(key, body.as_bytes(), None).await;
    }
    pipeline
        .wait_outcomes(&["processed", "duplicate", "conflict"], 5)
        .await;
    let conflicts = pipeline.outcomes("conflict") as usize;
    let mut keys: Vec<String> = pipeline
        .dead_letters(conflicts)
        .await
        .iter()
        .map(|d| d.header("dedupq-key").unwrap_or_default())
        .collect();
    keys.sort();
    let duplicates = pipeline.outcomes("duplicate");
    pipeline.stop().await;
    (keys, duplicates)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_version_2_one_amount_written_three_ways_is_one_payment_and_two_large_amounts_conflict(
) {
    let (conflicts, duplicates) = judge(2).await;

    assert_eq!(conflicts, ["big"]);
    assert_eq!(duplicates, 2);
}

/// The legacy canonical form read numbers through f64: the same test
/// catches both of its faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_form_is_caught_conflicting_on_10_point_0_and_merging_two_large_amounts() {
    let (conflicts, duplicates) = judge(1).await;

    assert_eq!(conflicts, ["ten", "ten"], "10.0 and 1e1 refused");
    assert_eq!(
        duplicates, 1,
        "the second large amount dropped as a duplicate"
    );
}

fn engine_with(store: &Store, version: i16) -> Engine {
    Engine::new(
        store.clone(),
        Arc::new(support::handlers::Recording::default()),
        Parser::new(&identity_with(version)),
        EngineOptions::default(),
        Metrics::new(),
        CancellationToken::new(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_stored_under_version_1_still_compare_as_version_1() {
    let (store, _) = isolated_store().await;
    let old = engine_with(&store, 1);
    let stored = old
        .process(&[
            support::message("acme", "v1-same", r#"{"amount": 12.5, "currency": "EUR"}"#),
            support::message("acme", "v1-other", r#"{"amount": 12, "currency": "EUR"}"#),
        ])
        .await
        .unwrap();
    assert!(stored.iter().all(|d| d.outcome == Outcome::Processed));
    let versions: Vec<i16> = sqlx::query_scalar("SELECT fingerprint_version FROM dedupq_keys")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(versions, [1, 1]);

    let provider = Provider::start(Knobs::default()).await;
    let setup = Setup::new(http_handler(
        &provider.charges_url(),
        Duration::from_secs(5),
    ));
    let pipeline = AmqpPayments::start_on(store, setup).await;
    pipeline
        .send("v1-same", br#"{"currency":"EUR","amount":12.5}"#, None)
        .await;
    pipeline
        .send("v1-other", br#"{"amount":13,"currency":"EUR"}"#, None)
        .await;
    pipeline.wait_outcomes(&["duplicate", "conflict"], 2).await;

    assert_eq!(pipeline.outcomes("duplicate"), 1);
    let dead = pipeline.dead_letters(1).await;
    assert_eq!(dead[0].header("dedupq-key").as_deref(), Some("v1-other"));
    assert_eq!(dead[0].header("dedupq-reason").as_deref(), Some("conflict"));
    assert_eq!(provider.stats().await.charges, 0, "neither ran again");
    pipeline.stop().await;
}

/// An open version-1 row (its outcome unknown, its lease over) meets a
/// version-2 message with another body under the same key: another
/// payment, so a conflict — never a takeover that runs the first request
/// and answers the second message with its outcome.
#[tokio::test]
async fn an_open_version_1_row_is_not_taken_over_by_another_body() {
    let (store, _) = isolated_store().await;
    let unknown = dedupq::handler::HandlerOutcome::Unknown {
        error: "no answer".into(),
    };
    let old = Engine::new(
        store.clone(),
        Arc::new(support::handlers::Recording::scripted(vec![unknown])),
        Parser::new(&identity_with(1)),
        support::fast_options(),
        Metrics::new(),
        CancellationToken::new(),
    );
    let first = old
        .process(&[support::message("acme", "v1-open", r#"{"amount": 12}"#)])
        .await
        .unwrap();
    assert_eq!(first[0].outcome, Outcome::Unknown);

    let handler = Arc::new(support::handlers::Recording::default());
    let new = Engine::new(
        store.clone(),
        handler.clone(),
        Parser::new(&identity_with(2)),
        support::fast_options(),
        Metrics::new(),
        CancellationToken::new(),
    );
    let other = new
        .process(&[support::message("acme", "v1-open", r#"{"amount": 13}"#)])
        .await
        .unwrap();
    assert_eq!(other[0].outcome, Outcome::Conflict);
    assert_eq!(handler.count(), 0);
}

/// Exponents are part of the exact value up to 10^9 (`10e999999999` is
/// `1e1000000000`, and neither is `1`); a number beyond that is refused
/// as invalid input, never claimed, never merged with another amount.
#[tokio::test]
async fn amounts_with_large_exponents_compare_exactly_and_beyond_the_limit_are_refused() {
    let (store, _) = isolated_store().await;
    let engine = engine_with(&store, 2);
    let amount = |key: &str, amount: &str| {
        support::message("acme", key, &format!(r#"{{"amount":{amount}}}"#))
    };
    let mut outcomes = Vec::new();
    for (key, value) in [
        ("edge", "1e1000000000"),
        ("edge", "10e999999999"),
        ("edge", "1"),
        ("beyond", "1e1000000001"),
        ("beyond", "1"),
    ] {
        let d = engine.process(&[amount(key, value)]).await.unwrap();
        outcomes.push(d[0].outcome);
    }

    assert_eq!(
        outcomes,
        [
            Outcome::Processed,
            Outcome::Duplicate,
            Outcome::Conflict,
            Outcome::Invalid,
            Outcome::Processed,
        ]
    );
}

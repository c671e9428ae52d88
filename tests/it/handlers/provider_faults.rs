use crate::support::{self, process::Provider};
use dedupq::engine::{Action, Outcome};
use dedupq::handler::{Handler, HandlerCall, HttpHandler};
use dedupq::store::KeyStatus;
use dedupq_provider::{Knobs, OddAnswer, DECLINED_CARD};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn a_declined_card_is_stored_failed_and_replayed_without_calling_the_provider() {
    let provider = Provider::start(Knobs::default()).await;
    let engine = super::payment_engine(&provider, Duration::from_secs(5)).await;
    let body = json!({"amount": 10, "currency": "EUR", "card": DECLINED_CARD}).to_string();
    let msg = support::message("acme", "declined-1", &body);

    let first = engine.process(std::slice::from_ref(&msg)).await.unwrap();
    let again = engine.process(&[msg]).await.unwrap();

    assert_eq!(first[0].outcome, Outcome::Failed);
    assert_eq!(again[0].outcome, Outcome::Duplicate);
    match &again[0].action {
        Action::Commit { reply: Some(r) } => {
            assert_eq!(r.status, KeyStatus::Failed);
            assert_eq!(r.result_status, 402);
            assert_eq!(support::json_of(&r.body)["error"], "card_declined");
        }
        other => panic!("unexpected {other:?}"),
    }
    let stats = provider.stats().await;
    assert_eq!(
        (stats.charges, stats.declined),
        (0, 1),
        "the provider saw one request"
    );
}

#[tokio::test]
async fn a_503_saying_retry_after_pauses_intake_the_probe_retries_it_and_it_charges_once() {
    let provider = Provider::start(Knobs {
        fail_next: 2,
        ..Knobs::default()
    })
    .await;
    let engine = super::payment_engine(&provider, Duration::from_secs(5)).await;
    let msg = support::message("acme", "flaky-1", r#"{"amount": 5, "currency": "EUR"}"#);

    let decisions = super::deliver_until_settled(&engine, &msg).await;

    // The first 503 says Retry-After: intake pauses, and the second try is
    // the probe; while it fails the batch is not decided (the transport
    // waits as asked), and the probe that is answered decides it.
    let outcomes: Vec<_> = decisions.iter().map(|d| d.outcome).collect();
    assert_eq!(outcomes, [Outcome::Retried, Outcome::Takeover]);
    assert_eq!(provider.stats().await.charges, 1);
}

#[tokio::test]
async fn a_provider_that_charges_and_never_answers_is_unknown_then_retried_with_the_same_key() {
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let engine = super::payment_engine(&provider, Duration::from_millis(700)).await;
    let msg = support::message("acme", "hang-1", r#"{"amount": 7, "currency": "EUR"}"#);

    let decisions = super::deliver_until_settled(&engine, &msg).await;

    assert_eq!(decisions[0].outcome, Outcome::Unknown);
    assert_eq!(decisions.last().unwrap().outcome, Outcome::Takeover);
    let charges = provider.charges_for("acme:hang-1").await;
    assert_eq!(charges.len(), 1, "the retry reused the key: one charge");
    assert_eq!(provider.stats().await.double_charged, 0);
}

/// A `201` whose body breaks off (the connection drops half-way) is not
/// stored as an empty success: the charge's id would be lost to every
/// replay. The key is unknown, and the retry with the same key gets the
/// provider's whole answer, which is what is stored and replayed.
#[tokio::test]
async fn a_charge_whose_answer_breaks_off_is_unknown_and_its_retry_stores_the_whole_answer() {
    let provider = Provider::start(Knobs {
        odd_answer: Some(OddAnswer::CutBody),
        odd_answer_next: 1,
        ..Knobs::default()
    })
    .await;
    let engine = super::payment_engine(&provider, Duration::from_secs(5)).await;
    let msg = support::message("acme", "cut-1", r#"{"amount": 8, "currency": "EUR"}"#);

    let decisions = super::deliver_until_settled(&engine, &msg).await;
    let again = engine.process(&[msg]).await.unwrap();

    assert_eq!(decisions[0].outcome, Outcome::Unknown, "{decisions:?}");
    assert_eq!(decisions.last().unwrap().outcome, Outcome::Takeover);
    let charges = provider.charges_for("acme:cut-1").await;
    assert_eq!(charges.len(), 1, "the retry reused the key: one charge");
    match &again[0].action {
        Action::Commit { reply: Some(r) } => {
            // The simulator replays a charge with 200.
            assert_eq!((r.status, r.result_status), (KeyStatus::Done, 200));
            assert_eq!(
                support::json_of(&r.body)["id"],
                format!("ch_{}", charges[0].id),
                "the stored answer names the charge"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// Sends a fresh key on every attempt, as a client without a derived key would.
struct FreshKeyEachAttempt(HttpHandler);

#[async_trait::async_trait]
impl Handler for FreshKeyEachAttempt {
    async fn handle(&self, call: &HandlerCall<'_>) -> dedupq::handler::HandlerOutcome {
        let fresh = support::unique("random-key");
        let call = HandlerCall {
            derived_key: &fresh,
            ..*call
        };
        self.0.handle(&call).await
    }
}

/// The harness must see the double charge that a per-attempt random key
/// causes when the first answer is lost; otherwise the single-charge tests
/// above prove nothing.
#[tokio::test]
async fn a_handler_with_a_fresh_key_per_attempt_is_caught_double_charging() {
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        ..Knobs::default()
    })
    .await;
    let (store, _) = support::isolated_store().await;
    let handler = FreshKeyEachAttempt(support::http_handler(
        &provider.charges_url(),
        Duration::from_millis(700),
    ));
    let engine = support::engine(&store, Arc::new(handler), support::fast_options());
    let msg = support::message("acme", "naive-1", r#"{"amount": 9, "currency": "EUR"}"#);

    super::deliver_until_settled(&engine, &msg).await;

    let stats = provider.stats().await;
    assert_eq!(stats.charges, 2, "two attempts with two keys: two charges");
    assert_eq!(stats.double_charged, 1);
}

#[tokio::test]
async fn a_provider_ignoring_keys_charges_again_when_an_answer_is_lost() {
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let engine = super::payment_engine(&provider, Duration::from_millis(700)).await;
    let msg = support::message("acme", "nokeys-1", r#"{"amount": 3, "currency": "EUR"}"#);

    super::deliver_until_settled(&engine, &msg).await;

    assert_eq!(
        provider.charges_for("acme:nokeys-1").await.len(),
        2,
        "dedupq cannot save a provider that ignores keys"
    );
}

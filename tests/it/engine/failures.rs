use crate::support::{self, handlers::Recording};
use dedupq::engine::{Action, DeadLetterReason, Outcome};
use dedupq::handler::{HandlerOutcome, HandlerResult};
use dedupq::store::KeyStatus;
use serde_json::json;
use std::sync::Arc;

fn transient() -> HandlerOutcome {
    HandlerOutcome::Transient {
        status: Some(503),
        error: "provider unavailable".into(),
        retry_after: None,
    }
}

#[tokio::test]
async fn a_permanent_failure_is_stored_and_replayed_without_running_again() {
    let (store, _) = support::isolated_store().await;
    let declined =
        HandlerOutcome::Permanent(HandlerResult::json(402, &json!({"error": "card declined"})));
    let handler = Arc::new(Recording::scripted(vec![declined]));
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let msg = support::message("acme", "declined", r#"{"amount": 1}"#);

    let first = engine.process(std::slice::from_ref(&msg)).await.unwrap();
    let again = engine.process(&[msg]).await.unwrap();

    assert_eq!(first[0].outcome, Outcome::Failed);
    assert_eq!(again[0].outcome, Outcome::Duplicate);
    match &again[0].action {
        Action::Commit { reply: Some(r) } => {
            assert_eq!(r.status, KeyStatus::Failed);
            assert_eq!(r.result_status, 402);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn a_transient_failure_releases_the_key_and_the_retry_takes_it_over_at_once() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::scripted(vec![transient()]));
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let msg = support::message("acme", "flaky", r#"{"amount": 1}"#);

    let first = engine.process(std::slice::from_ref(&msg)).await.unwrap();
    assert_eq!(first[0].outcome, Outcome::Retried);
    assert!(matches!(first[0].action, Action::RetryLater { .. }));
    let second = engine.process(&[msg]).await.unwrap();

    assert_eq!(
        second[0].outcome,
        Outcome::Takeover,
        "released: no waiting for the lease"
    );
    let calls = handler.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].derived_key, calls[1].derived_key);
}

#[tokio::test]
async fn after_max_attempts_a_transient_failure_leaves_the_key_free_and_is_dead_lettered_saying_a_replay_runs_it(
) {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::scripted(vec![transient(); 3]));
    let mut options = support::fast_options();
    options.max_attempts = 3;
    let engine = support::engine(&store, handler.clone(), options);
    let msg = support::message("acme", "dead", r#"{"amount": 1}"#);

    let mut outcomes = Vec::new();
    for _ in 0..3 {
        outcomes.push(
            engine
                .process(std::slice::from_ref(&msg))
                .await
                .unwrap()
                .remove(0),
        );
    }

    assert_eq!(outcomes[0].outcome, Outcome::Retried);
    assert_eq!(outcomes[1].outcome, Outcome::Retried);
    assert_eq!(
        outcomes[2].outcome,
        Outcome::Retried,
        "nothing reached the provider: not failed"
    );
    let Action::DeadLetter {
        reason: DeadLetterReason::ExhaustedRetries,
        detail,
    } = &outcomes[2].action
    else {
        panic!("{:?}", outcomes[2].action)
    };
    assert!(detail.contains("replaying"), "{detail}");
    let parsed = dedupq::engine::Parser::new(&Default::default())
        .parse(&msg)
        .unwrap();
    let row = store.show_key(&parsed.identity).await.unwrap().unwrap();
    assert_eq!(
        row.status,
        KeyStatus::InProgress,
        "the key is left free, never stored failed"
    );
    // The dead letter replayed: the payment runs (and succeeds) at once.
    let replayed = engine.process(&[msg]).await.unwrap();
    assert_eq!(replayed[0].outcome, Outcome::Takeover);
    assert_eq!(handler.count(), 4);
}

#[tokio::test]
async fn an_unknown_outcome_is_recorded_and_retried_with_the_same_derived_key() {
    let (store, _) = support::isolated_store().await;
    let unknown = HandlerOutcome::Unknown {
        error: "timed out after sending".into(),
    };
    let handler = Arc::new(Recording::scripted(vec![unknown]));
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let msg = support::message("acme", "maybe", r#"{"amount": 1}"#);

    let first = engine.process(std::slice::from_ref(&msg)).await.unwrap();
    assert_eq!(first[0].outcome, Outcome::Unknown);
    let parsed = dedupq::engine::Parser::new(&Default::default())
        .parse(&msg)
        .unwrap();
    let row = store.show_key(&parsed.identity).await.unwrap().unwrap();
    assert_eq!(row.status, KeyStatus::Unknown);
    let second = engine.process(&[msg]).await.unwrap();

    assert_eq!(second[0].outcome, Outcome::Takeover);
    let calls = handler.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].derived_key, "acme:maybe");
}

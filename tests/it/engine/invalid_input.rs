use crate::support::{self, handlers::Recording};
use dedupq::engine::{Action, DeadLetterReason, InvalidReason, Outcome};
use std::sync::Arc;

#[tokio::test]
async fn invalid_messages_are_dead_lettered_with_a_reason_and_claim_nothing() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::default());
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let mut no_key = support::message("acme", "x", r#"{"amount": 1}"#);
    no_key.headers.retain(|h| !h.is("idempotency-key"));
    let mut no_tenant = support::message("acme", "x", r#"{"amount": 1}"#);
    no_tenant.headers.retain(|h| !h.is("client-id"));
    let long_key = support::message("acme", &"k".repeat(256), r#"{"amount": 1}"#);
    let not_json = support::message("acme", "nj", "amount=1");
    let array = support::message("acme", "arr", "[1,2]");
    let huge = support::message(
        "acme",
        "big",
        &format!(r#"{{"pad": "{}"}}"#, "x".repeat(1024 * 1024)),
    );
    let valid = support::message("acme", "ok", r#"{"amount": 1}"#);

    let batch = [no_key, no_tenant, long_key, not_json, array, huge, valid];
    let decisions = engine.process(&batch).await.unwrap();

    let labels: Vec<_> = decisions[..6]
        .iter()
        .map(|d| match &d.action {
            Action::DeadLetter {
                reason: DeadLetterReason::Invalid(r),
                detail,
            } => {
                assert!(!detail.is_empty());
                assert_eq!(d.outcome, Outcome::Invalid);
                r.label()
            }
            other => panic!("expected a dead letter, got {other:?}"),
        })
        .collect();
    assert_eq!(
        labels,
        [
            "bad_key",
            "bad_tenant",
            "bad_key",
            "not_json",
            "not_json",
            "too_large"
        ]
    );
    assert!(matches!(
        &decisions[5].action,
        Action::DeadLetter {
            reason: DeadLetterReason::Invalid(InvalidReason::TooLarge { .. }),
            ..
        }
    ));
    assert_eq!(
        decisions[6].outcome,
        Outcome::Processed,
        "the batch keeps flowing"
    );
    assert_eq!(handler.count(), 1);
    assert_eq!(
        support::count_rows(&store).await,
        1,
        "only the valid message claimed a key"
    );
}

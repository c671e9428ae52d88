use crate::support::{self, handlers::Recording};
use dedupq::engine::{Action, DeadLetterReason, Outcome};
use std::sync::Arc;

#[tokio::test]
async fn the_same_key_with_a_different_amount_is_a_conflict_and_never_runs() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::default());
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let first = support::message("acme", "pay-1", r#"{"amount": 100, "currency": "EUR"}"#);
    let other = support::message("acme", "pay-1", r#"{"amount": 999, "currency": "EUR"}"#);

    let d1 = engine.process(&[first]).await.unwrap();
    let d2 = engine.process(&[other]).await.unwrap();

    assert_eq!(d1[0].outcome, Outcome::Processed);
    assert_eq!(d2[0].outcome, Outcome::Conflict);
    assert!(matches!(
        d2[0].action,
        Action::DeadLetter {
            reason: DeadLetterReason::Conflict,
            ..
        }
    ));
    assert_eq!(handler.count(), 1);
}

#[tokio::test]
async fn reordered_fields_and_a_changed_sent_at_are_the_same_operation() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::default());
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let first = support::message(
        "acme",
        "pay-2",
        r#"{"amount": 100, "currency": "EUR", "sent_at": "2026-11-29T10:00:00Z"}"#,
    );
    let again = support::message(
        "acme",
        "pay-2",
        r#"{ "sent_at": "2026-11-29T10:05:00Z", "currency": "EUR",   "amount": 100 }"#,
    );

    engine.process(&[first]).await.unwrap();
    let d = engine.process(&[again]).await.unwrap();

    assert_eq!(d[0].outcome, Outcome::Duplicate);
    assert_eq!(handler.count(), 1);
}

/// A key finished by an earlier release (fingerprint version 1) is still
/// compared under version 1: the same payment is a duplicate, another
/// amount a conflict.
#[tokio::test]
async fn keys_stored_under_fingerprint_version_one_are_compared_under_it() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::default());
    let old_release = dedupq::config::IdentitySettings {
        fingerprint: dedupq::fingerprint::FingerprintSpec {
            version: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let old = dedupq::engine::Engine::new(
        store.clone(),
        handler.clone(),
        dedupq::engine::Parser::new(&old_release),
        support::fast_options(),
        dedupq::metrics::Metrics::new(),
        tokio_util::sync::CancellationToken::new(),
    );
    let body = r#"{"amount": 10.5, "currency": "EUR"}"#;
    let first = old
        .process(&[support::message("acme", "pay-v1", body)])
        .await
        .unwrap();
    assert_eq!(first[0].outcome, Outcome::Processed);

    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let same = support::message("acme", "pay-v1", r#"{"currency": "EUR", "amount": 10.5}"#);
    let other = support::message("acme", "pay-v1", r#"{"amount": 11, "currency": "EUR"}"#);
    assert_eq!(
        engine.process(&[same]).await.unwrap()[0].outcome,
        Outcome::Duplicate
    );
    assert_eq!(
        engine.process(&[other]).await.unwrap()[0].outcome,
        Outcome::Conflict
    );
    assert_eq!(handler.count(), 1);
}

use crate::support::{self, handlers::Recording};
use dedupq::engine::{Action, Outcome};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_deliveries_of_one_key_run_the_handler_once() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::with_delay(Duration::from_millis(300)));
    let engine = support::engine(&store, handler.clone(), support::fast_options());

    let deliveries = (0..50).map(|_| {
        let engine = engine.clone();
        tokio::spawn(async move {
            let msg = support::message("acme", "pay-50", r#"{"amount": 100, "currency": "EUR"}"#);
            engine.process(&[msg]).await.expect("store reachable")
        })
    });
    let decisions: Vec<_> = futures::future::join_all(deliveries)
        .await
        .into_iter()
        .flat_map(|r| r.expect("task did not panic"))
        .collect();

    assert_eq!(handler.count(), 1, "the handler must run exactly once");
    let processed = decisions
        .iter()
        .filter(|d| d.outcome == Outcome::Processed)
        .count();
    assert_eq!(processed, 1);
    for d in decisions.iter().filter(|d| d.outcome != Outcome::Processed) {
        assert!(
            matches!(d.outcome, Outcome::Duplicate | Outcome::InFlight),
            "unexpected outcome {:?}",
            d.outcome
        );
        if d.outcome == Outcome::InFlight {
            assert!(matches!(d.action, Action::RetryLater { .. }));
        }
    }
}

#[tokio::test]
async fn repeats_of_a_key_inside_one_batch_run_once_and_replay_the_result() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::default());
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let batch: Vec<_> = (0..5)
        .map(|_| support::message("acme", "same", r#"{"amount": 1}"#))
        .collect();

    let decisions = engine.process(&batch).await.unwrap();

    assert_eq!(handler.count(), 1);
    assert_eq!(decisions[0].outcome, Outcome::Processed);
    for d in &decisions[1..] {
        assert_eq!(d.outcome, Outcome::Duplicate);
        assert_eq!(
            d.action, decisions[0].action,
            "duplicates replay the stored result"
        );
    }
}

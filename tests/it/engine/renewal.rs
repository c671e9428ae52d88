use crate::support::{self, handlers::Recording};
use dedupq::engine::Outcome;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_three_times_slower_than_the_lease_keeps_its_claim() {
    let (store, _) = support::isolated_store().await;
    let mut options = support::fast_options();
    options.lease = Duration::from_secs(1);
    options.renew_every = Duration::from_millis(250);
    let slow = Arc::new(Recording::with_delay(Duration::from_secs(3)));
    let owner = support::engine(&store, slow.clone(), options.clone());
    let msg = support::message("acme", "pay-slow", r#"{"amount": 7}"#);
    let running = tokio::spawn({
        let msg = msg.clone();
        async move { owner.process(&[msg]).await.unwrap() }
    });

    let parsed = dedupq::engine::Parser::new(&Default::default())
        .parse(&msg)
        .unwrap();
    support::eventually(
        Duration::from_secs(10),
        "the slow worker's claim",
        || async { store.show_key(&parsed.identity).await.unwrap().map(|_| ()) },
    )
    .await;

    // Another worker keeps trying while the slow handler runs.
    let rival_handler = Arc::new(Recording::default());
    options.owner = support::unique("rival");
    let rival = support::engine(&store, rival_handler.clone(), options);
    let mut rival_outcomes = Vec::new();
    while !running.is_finished() {
        let d = rival.process(std::slice::from_ref(&msg)).await.unwrap();
        rival_outcomes.push(d[0].outcome);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let decisions = running.await.unwrap();

    assert_eq!(decisions[0].outcome, Outcome::Processed);
    assert_eq!(
        rival_handler.count(),
        0,
        "nobody took over a live, renewed lease"
    );
    assert!(rival_outcomes.len() > 10);
    assert!(
        rival_outcomes
            .iter()
            .all(|o| matches!(o, Outcome::InFlight | Outcome::Duplicate)),
        "{rival_outcomes:?}"
    );
    assert_eq!(slow.count(), 1);
}

/// Renewals every few milliseconds while handlers finish at random
/// moments: a renewal that finds a key already finished (its result stored
/// while the renewal was under way) is not a lost lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_stored_while_a_renewal_is_under_way_is_not_a_lost_lease() {
    let (store, _) = support::isolated_store().await;
    let mut options = support::fast_options();
    options.lease = Duration::from_secs(5);
    options.renew_every = Duration::from_millis(5);
    let handler = Arc::new(Recording::with_jitter(Duration::from_millis(40)));
    let engine = support::engine(&store, handler.clone(), options);
    let batch: Vec<_> = (0..300)
        .map(|i| support::message("acme", &format!("pay-{i}"), r#"{"amount": 1}"#))
        .collect();
    let decisions = engine.process(&batch).await.unwrap();
    assert!(decisions.iter().all(|d| d.outcome == Outcome::Processed));
    assert_eq!(handler.count(), 300);
    assert_eq!(
        engine.metrics().lost_leases.get(),
        0,
        "no lease was lost: every key's own worker stored its result"
    );
    assert_eq!(engine.metrics().fenced_writes.get(), 0);
}

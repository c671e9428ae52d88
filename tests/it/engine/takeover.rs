use crate::support::{self, handlers::Recording};
use dedupq::config::IdentitySettings;
use dedupq::engine::{Outcome, Parser};
use dedupq::identity::Epoch;
use dedupq::store::{Answer, Claim, ClaimResult, Finish, FinishWrite, KeyStatus, Written};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// A worker claims a key and "crashes" (never finishes); the next delivery
/// after the lease takes over with epoch 2 and the same derived key, and the
/// crashed worker's late write is fenced.
#[tokio::test]
async fn a_crashed_workers_key_is_taken_over_after_the_lease_and_its_late_write_is_fenced() {
    let (store, _) = support::isolated_store().await;
    let msg = support::message("acme", "pay-crash", r#"{"amount": 5}"#);
    let parsed = Parser::new(&IdentitySettings::default())
        .parse(&msg)
        .unwrap();
    let request = support::claim_request(&parsed, &msg);
    let crashed = store
        .claim_batch(&[request], "crashed-worker", Duration::from_secs(1))
        .await
        .unwrap();
    let [ClaimResult::Won(won)] = &crashed[..] else {
        panic!("a new key is won: {crashed:?}");
    };
    assert_eq!(
        *won,
        Claim {
            epoch: Epoch(1),
            attempts: 1,
            counted: 1,
            uncertain: false,
            stored_request: None,
            age: Duration::ZERO,
            at: won.at,
        }
    );
    assert!(won.at.is_some(), "a claim says where it wrote the row");

    let handler = Arc::new(Recording::with_delay(Duration::from_millis(1500)));
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let first = engine.process(std::slice::from_ref(&msg)).await.unwrap();
    assert_eq!(
        first[0].outcome,
        Outcome::InFlight,
        "the lease is still live"
    );
    assert_eq!(handler.count(), 0);

    let retrying = tokio::spawn({
        let engine = engine.clone();
        async move {
            loop {
                let d = engine.process(std::slice::from_ref(&msg)).await.unwrap();
                if d[0].outcome != Outcome::InFlight {
                    return d[0].clone();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    // While the new owner's handler runs, the crashed worker wakes up and
    // tries to store its own result with its old epoch.
    support::eventually(Duration::from_secs(10), "takeover with epoch 2", || async {
        let row = store.show_key(&parsed.identity).await.unwrap()?;
        (row.epoch == 2).then_some(())
    })
    .await;
    let late = store
        .finish_batch(&[FinishWrite {
            identity: &parsed.identity,
            epoch: Epoch(1),
            finish: Finish::Done(Answer {
                status: 200,
                body: json!({"stale": true}).to_string().into_bytes(),
                content_type: None,
            }),
            at: None,
        }])
        .await
        .unwrap();
    assert_eq!(late, vec![Written::Fenced], "a stale epoch must not land");

    let taken = tokio::time::timeout(Duration::from_secs(10), retrying)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.outcome, Outcome::Takeover);
    assert_eq!(taken.epoch, Some(Epoch(2)));
    let calls = handler.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].derived_key, "acme:pay-crash",
        "same derived key on every attempt"
    );
    assert_eq!(calls[0].attempt, 2);
    let row = store.show_key(&parsed.identity).await.unwrap().unwrap();
    assert_eq!(row.status, KeyStatus::Done);
    assert_eq!(row.epoch, 2);
    assert_eq!(
        support::json_of(row.result_body.unwrap().get().as_bytes())["tenant"],
        "acme",
        "the new owner's result stays"
    );
}

#[tokio::test]
async fn a_fenced_completion_is_reported_as_lease_lost_and_counted() {
    let (store, _) = support::isolated_store().await;
    let msg = support::message("acme", "pay-fenced", r#"{"amount": 5}"#);
    let parsed = Parser::new(&IdentitySettings::default())
        .parse(&msg)
        .unwrap();
    // The engine's handler is slow; meanwhile an operator releases the key
    // and another worker takes it over, so the first owner's write is stale.
    let handler = Arc::new(Recording::with_delay(Duration::from_millis(800)));
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let running = tokio::spawn({
        let engine = engine.clone();
        let msg = msg.clone();
        async move { engine.process(&[msg]).await.unwrap() }
    });
    support::eventually(Duration::from_secs(5), "claim", || async {
        store.show_key(&parsed.identity).await.unwrap().map(|_| ())
    })
    .await;
    store
        .release_key(&parsed.identity, "test", "tester", true)
        .await
        .unwrap();
    let request = support::claim_request(&parsed, &msg);
    let thief = store
        .claim_batch(&[request], "other", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(thief[0], ClaimResult::TakenOver { .. }));

    let decisions = running.await.unwrap();
    assert_eq!(decisions[0].outcome, Outcome::LeaseLost);
    assert_eq!(engine.metrics().fenced_writes.get(), 1);
    let row = store.show_key(&parsed.identity).await.unwrap().unwrap();
    assert_eq!(
        row.status,
        KeyStatus::InProgress,
        "the stale result was not stored"
    );
    assert_eq!(row.owner, "other");
}

/// A held key's time left is PostgreSQL's answer (what the backoff of an
/// in-flight message is built on), not the lease end read against this
/// worker's clock.
#[tokio::test]
async fn a_key_held_by_a_live_lease_tells_how_long_the_lease_has_left() {
    let (store, _) = support::isolated_store().await;
    let msg = support::message("acme", "pay-held", r#"{"amount": 5}"#);
    let parsed = Parser::new(&IdentitySettings::default())
        .parse(&msg)
        .unwrap();
    let lease = Duration::from_secs(20);
    let request = support::claim_request(&parsed, &msg);
    store
        .claim_batch(&[request], "worker-1", lease)
        .await
        .unwrap();

    let request = support::claim_request(&parsed, &msg);
    let held = store
        .claim_batch(&[request], "worker-2", lease)
        .await
        .unwrap();
    let [ClaimResult::Held { lease_left }] = held[..] else {
        panic!("{held:?}")
    };
    assert!(
        lease_left > Duration::from_secs(15) && lease_left <= lease,
        "{lease_left:?} of a 20 s lease just taken"
    );
}

//! Group commit on the HTTP path: concurrent requests share claim
//! statements, each gets its own answer, and a claim statement waiting on
//! a row lock held from psql does not hold back the claims of new payments.

use super::harness::App;
use crate::support::pg_faults::RowLock;
use crate::support::process::Provider;
use dedupq_provider::Knobs;
use std::time::Duration;

fn body(n: usize) -> String {
    format!(
        r#"{{"amount": {}, "currency": "EUR", "recipient": "shop-{n}"}}"#,
        100 + n
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_share_claim_statements_and_each_gets_its_own_charge() {
    let provider = Provider::start(Knobs::default()).await;
    // Sixty provider calls at once on a busy machine can take seconds; this
    // test is about sharing statements, not about a handler running late.
    let app = App::with(&provider, |s, _| {
        s.engine.lease = Duration::from_secs(30);
        s.engine.renew_every = Duration::from_secs(10);
        s.handler.timeout = Duration::from_secs(20);
        s.api.request_timeout = Duration::from_secs(30);
    })
    .await;
    const N: usize = 60;
    let app = &app;
    let answers = futures::future::join_all(
        (0..N).map(|n| async move { (n, app.pay(&format!("grp-{n}"), &body(n)).await) }),
    )
    .await;
    for (n, answer) in &answers {
        assert_eq!(answer.status, 201, "grp-{n}: {answer:?}");
        let charges = provider.charges_for(&format!("acme:grp-{n}")).await;
        assert_eq!(charges.len(), 1, "grp-{n}: {charges:?}");
        assert_eq!(
            answer.json()["id"],
            format!("ch_{}", charges[0].id),
            "grp-{n} is answered with its own charge"
        );
    }
    assert_eq!(provider.stats().await.charges, N as i64);
    let statements = app.metrics.claim_batch_size.get_sample_count();
    let claimed = app.metrics.claim_batch_size.get_sample_sum();
    assert_eq!(claimed, N as f64, "every request claimed once");
    assert!(
        statements < N as u64,
        "{N} concurrent requests took {statements} claim statements: none shared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_waiting_on_a_row_lock_does_not_hold_back_the_claims_of_new_payments() {
    // Far longer than a statement takes on a busy machine: a new payment
    // stuck behind the waiting claim would take this long to be answered.
    const LOCK_TIMEOUT: Duration = Duration::from_secs(12);
    let provider = Provider::start(Knobs::default()).await;
    let mut schema = String::new();
    let app = App::with(&provider, |s, _| {
        schema = s.store.schema.clone().expect("test schema");
        s.store.lock_timeout = LOCK_TIMEOUT;
        s.api.request_timeout = Duration::from_secs(30);
        // Eight provider calls at once on a busy machine can take seconds;
        // this test is about claims, not about a handler running late.
        s.engine.lease = Duration::from_secs(30);
        s.engine.renew_every = Duration::from_secs(10);
        s.handler.timeout = Duration::from_secs(10);
    })
    .await;
    assert_eq!(app.pay("held", &body(0)).await.status, 201);
    let mut lock = RowLock::take(&schema, "acme", "held").await;
    let app = std::sync::Arc::new(app);
    let retry = {
        let app = app.clone();
        tokio::spawn(async move { app.pay("held", &body(0)).await })
    };
    // On a busy machine the retry can take a while to reach PostgreSQL;
    // it must then wait there, not be answered without waiting.
    let waiting_from = tokio::time::Instant::now() + Duration::from_secs(30);
    while lock.waiters().await == 0 {
        assert!(
            !retry.is_finished(),
            "the retry was answered without waiting for the row lock: {:?}",
            retry.await
        );
        assert!(
            tokio::time::Instant::now() < waiting_from,
            "the retry's claim never waited for the row lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = tokio::time::Instant::now();
    let answers = futures::future::join_all((1..=8).map(|n| {
        let app = app.clone();
        async move { (n, app.pay(&format!("new-{n}"), &body(n)).await) }
    }))
    .await;
    let took = started.elapsed();
    for (n, answer) in &answers {
        assert_eq!(answer.status, 201, "new-{n}: {answer:?}");
    }
    assert!(
        took < LOCK_TIMEOUT / 2,
        "new payments took {took:?} while one claim waited on a row lock (lock_timeout {LOCK_TIMEOUT:?})"
    );
    assert!(
        lock.waiters().await > 0,
        "the retry's claim still waits: the new payments did not wait for it"
    );
    lock.release().await;

    let retried = retry.await.expect("the retry is answered");
    assert!(
        [201, 409, 503].contains(&retried.status),
        "the retry of a stored key: {retried:?}"
    );
    assert_eq!(provider.charges_for("acme:held").await.len(), 1);
    assert_eq!(provider.stats().await.charges, 9);
}

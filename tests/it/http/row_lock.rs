//! A key's row locked from psql while a client keeps retrying that key:
//! the retries share one claim (409 at once), each claim waits at most
//! `store.lock_timeout`, and claims never take the connections that lease
//! renewals and finishes need. A payment in flight meanwhile renews its
//! lease and is stored; new payments are answered.

use super::harness::App;
use crate::support::pg_faults::RowLock;
use crate::support::process::Provider;
use dedupq_provider::Knobs;
use std::time::Duration;

const BODY: &str = r#"{"amount": 100, "currency": "EUR", "recipient": "shop-1"}"#;

fn other(n: usize) -> String {
    format!(
        r#"{{"amount": {}, "currency": "EUR", "recipient": "shop-{n}"}}"#,
        200 + n
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retries_of_a_key_locked_in_psql_never_starve_the_pool_of_a_payment_in_flight_or_new_ones()
{
    let provider = Provider::start(Knobs::default()).await;
    let mut schema = String::new();
    let app = App::with(&provider, |s, _| {
        schema = s.store.schema.clone().expect("test schema");
        // A small pool, as a busy replica's would be.
        s.store.max_connections = 4;
        s.store.acquire_timeout = Duration::from_secs(2);
        // The provider answers in 2 s below: a handler timeout with room
        // for a loaded machine, and a lease renewed every second.
        s.engine.lease = Duration::from_secs(8);
        s.engine.renew_every = Duration::from_secs(1);
        s.handler.timeout = Duration::from_secs(6);
        s.api.request_timeout = Duration::from_secs(15);
    })
    .await;
    assert_eq!(app.pay("locked", BODY).await.status, 201);
    let lock = RowLock::take(&schema, "acme", "locked").await;
    // From now on the provider answers in 2 s: a payment in flight has to
    // renew its lease at least once, while the retries hammer.
    provider
        .set_knobs(serde_json::json!({ "latency": "2s" }))
        .await;

    let hammer = {
        let app_base = app.base.clone();
        tokio::spawn(async move {
            let client = super::harness::client();
            let mut answers = Vec::new();
            let until = tokio::time::Instant::now() + Duration::from_secs(6);
            while tokio::time::Instant::now() < until {
                let tries = (0..12).map(|_| {
                    client
                        .post(format!("{app_base}/v1/payments"))
                        .bearer_auth(super::harness::ACME_KEY)
                        .header("Idempotency-Key", "locked")
                        .header("content-type", "application/json")
                        .body(BODY)
                        .send()
                });
                for r in futures::future::join_all(tries).await {
                    answers.push(r.map(|r| r.status().as_u16()).unwrap_or(0));
                }
            }
            answers
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let app_ref = &app;
    let body0 = other(0);
    let in_flight = app_ref.pay("in-flight", &body0);
    let fresh = futures::future::join_all((1..=3).map(|n| {
        let body = other(n);
        async move { app_ref.pay(&format!("fresh-{n}"), &body).await }
    }));
    let (in_flight, fresh) = tokio::join!(in_flight, fresh);
    assert_eq!(
        in_flight.status, 201,
        "the payment in flight is stored: {in_flight:?}"
    );
    assert_eq!(
        app.status("acme", "in-flight").await.as_deref(),
        Some("done")
    );
    for (n, r) in fresh.iter().enumerate() {
        assert_eq!(r.status, 201, "fresh-{}: {r:?}", n + 1);
    }
    let answers = hammer.await.expect("retries");
    assert!(
        answers.iter().all(|s| *s == 409),
        "every retry of the locked key is answered 409 (in flight), never a timeout: {answers:?}"
    );
    let claims = app.metrics.claims.with_label_values(&["locked"]).get() as usize;
    assert!(
        claims >= 1 && claims * 4 <= answers.len(),
        "the retries shared claims: {claims} locked claims for {} retries",
        answers.len()
    );
    lock.release().await;
    let after = app.pay("locked", BODY).await;
    assert_eq!(after.status, 201, "{after:?}");
    assert!(after.replayed());
    assert_eq!(provider.stats().await.charges, 5, "one charge per payment");
    app.stop().await;
}

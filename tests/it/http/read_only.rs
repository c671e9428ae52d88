//! PostgreSQL fails over to read-only, or lets none of dedupq's sessions
//! in, while a sync request's charge is on its way: the request is not
//! answered as done nor as failed before its outcome is stored; new
//! requests meanwhile are refused with 503 and Retry-After (nothing run);
//! once PostgreSQL takes writes again, the retry gets the one stored
//! charge.

use super::harness::App;
use crate::support::eventually;
use crate::support::pg_faults::{FaultyRole, RoleFault as Fault};
use crate::support::process::Provider;
use dedupq_provider::Knobs;
use std::time::Duration;

const BODY: &str = r#"{"amount": 100, "currency": "EUR", "recipient": "shop-1"}"#;
const OTHER: &str = r#"{"amount": 200, "currency": "EUR", "recipient": "shop-2"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_request_charged_while_postgres_turns_read_only_is_stored_afterwards_and_new_ones_get_503(
) {
    charged_during(Fault::ReadOnly).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_request_charged_while_postgres_refuses_connections_is_stored_afterwards_and_new_ones_get_503(
) {
    charged_during(Fault::NoConnections).await;
}

async fn charged_during(fault: Fault) {
    let provider = Provider::start(Knobs {
        latency: Duration::from_secs(2),
        ..Knobs::default()
    })
    .await;
    let role = FaultyRole::create().await;
    let app = App::with(&provider, |s, _| {
        s.store = role.store_settings(&s.store);
        s.handler.timeout = Duration::from_millis(2500);
        s.api.request_timeout = Duration::from_secs(6);
    })
    .await;
    app.wait_ready().await;

    let first = {
        let url = app.url("payments");
        tokio::spawn(async move {
            super::harness::client()
                .post(url)
                .bearer_auth(super::harness::ACME_KEY)
                .header("Idempotency-Key", "pay-ro")
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    eventually(Duration::from_secs(10), "the provider charged", || async {
        (provider.stats().await.charges == 1).then_some(())
    })
    .await;
    role.begin(fault).await;
    let first = first.await.expect("task").expect("an answer");
    assert_eq!(
        first, 504,
        "not answered as stored before it is: still running, retry"
    );
    let new = app.pay("pay-new", OTHER).await;
    assert_eq!(new.status, 503, "{new:?}");
    assert!(new.retry_after() >= 1);
    assert_eq!(
        provider.stats().await.charges,
        1,
        "nothing run for the new one"
    );
    assert_eq!(app.decided("http", "invalid"), 0);

    role.end(fault).await;
    // The stored charge: the first request's own answer (201), or, if its
    // lease could not be kept through the outage and a retry took the key
    // over, the provider's replay of that one charge (200).
    let retried = eventually(Duration::from_secs(30), "the stored charge", || async {
        let r = app.pay("pay-ro", BODY).await;
        (200..300).contains(&r.status).then_some(r)
    })
    .await;
    assert!(
        retried.replayed() || retried.status == 200,
        "the stored 201, replayed, or the takeover's own answer: {retried:?}"
    );
    assert_eq!(app.pay("pay-new", OTHER).await.status, 201);
    assert_eq!(provider.stats().await.charges, 2, "one charge each");
    app.stop().await;
    role.drop().await;
}

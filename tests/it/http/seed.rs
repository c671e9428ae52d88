//! The seed article's table, against the real server: `POST /payments`
//! with an Idempotency-Key, retried while the first request still runs.

use super::harness::{App, GLOBEX_KEY};
use crate::support::eventually;
use crate::support::process::Provider;
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

const ORDER: &str = r#"{"amount": 100, "currency": "RUB", "recipient": "shop-1"}"#;

/// A provider that charges every call, whatever its key (as the seed's
/// `charge` does): any second execution dedupq lets through is a second
/// charge.
fn forgetful(latency: Duration) -> Knobs {
    Knobs {
        latency,
        honour_keys: false,
        ..Knobs::default()
    }
}

/// Room for a busy machine: the second request must reach dedupq while
/// the first one's provider call still runs.
fn patient(s: &mut dedupq::config::Settings) {
    s.handler.timeout = Duration::from_secs(10);
    s.engine.lease = Duration::from_secs(15);
    s.engine.renew_every = Duration::from_secs(3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_concurrent_posts_with_one_key_charge_once() {
    let provider = Provider::start(forgetful(Duration::from_secs(4))).await;
    let app = App::with(&provider, |s, _| patient(s)).await;

    let (a, b) = tokio::join!(app.pay("order-1", ORDER), app.pay("order-1", ORDER));

    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(statuses, [201, 409], "{a:?}\n{b:?}");
    assert_eq!(provider.stats().await.charges, 1, "one charge");
    let charged = if a.status == 201 { &a } else { &b };
    assert!(!charged.replayed());
    assert!(charged.json()["id"].as_str().unwrap().starts_with("ch_"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_while_the_first_request_runs_answers_409_and_a_retry_after_it_replays_its_answer()
{
    let provider = Provider::start(forgetful(Duration::from_secs(5))).await;
    let app = App::with(&provider, |s, _| patient(s)).await;

    let first = tokio::spawn({
        let url = app.url("payments");
        async move {
            let request = super::harness::client()
                .post(url)
                .bearer_auth(super::harness::ACME_KEY)
                .header("Idempotency-Key", "order-2")
                .body(ORDER);
            super::harness::Reply::from(request.send().await.expect("first request")).await
        }
    });
    eventually(
        Duration::from_secs(10),
        "the provider is charging",
        || async { (provider.stats().await.charges == 1).then_some(()) },
    )
    .await;

    let during = app.pay("order-2", ORDER).await;
    let kind = during.problem(409);
    assert_eq!(kind, "urn:dedupq:problem:request-in-progress");
    assert!(during.retry_after() >= 1);

    let first = first.await.expect("first request task");
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());

    let after = app.pay("order-2", ORDER).await;
    assert_eq!(after.status, 201, "{after:?}");
    assert!(after.replayed(), "marked Idempotent-Replayed: true");
    assert_eq!(
        after.json(),
        first.json(),
        "the stored body, byte for byte the same JSON"
    );
    assert_eq!(provider.stats().await.charges, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_key_with_a_different_amount_answers_422_and_charges_nothing() {
    let provider = Provider::start(forgetful(Duration::ZERO)).await;
    let app = App::with(&provider, |_, _| {}).await;

    assert_eq!(app.pay("order-3", ORDER).await.status, 201);
    let other = r#"{"amount": 500, "currency": "RUB", "recipient": "shop-1"}"#;
    let reused = app.pay("order-3", other).await;
    assert_eq!(reused.problem(422), "urn:dedupq:problem:key-reused");

    // Fields the fingerprint leaves out (sent_at) do not make another operation.
    let resent = json!({"amount": 100, "currency": "RUB", "recipient": "shop-1", "sent_at": "now"});
    let again = app.pay("order-3", &resent.to_string()).await;
    assert_eq!((again.status, again.replayed()), (201, true), "{again:?}");
    assert_eq!(provider.stats().await.charges, 1);
    assert_eq!(app.decided("http", "conflict"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_key_under_another_tenant_is_another_payment() {
    let provider = Provider::start(forgetful(Duration::ZERO)).await;
    let app = App::with(&provider, |_, _| {}).await;

    let acme = app.pay("order-1", ORDER).await;
    let globex = app
        .post("payments", Some(GLOBEX_KEY), Some("order-1"), ORDER)
        .await;
    assert_eq!((acme.status, globex.status), (201, 201));
    assert!(!globex.replayed(), "not acme's stored answer");
    assert_ne!(acme.json()["id"], globex.json()["id"]);
    assert_eq!(provider.stats().await.charges, 2, "one charge per tenant");
    assert_eq!(provider.charges_for("acme:order-1").await.len(), 1);
    assert_eq!(provider.charges_for("globex:order-1").await.len(), 1);

    let acme_again = app.pay("order-1", ORDER).await;
    assert_eq!(
        acme_again.json(),
        acme.json(),
        "each tenant replays its own"
    );
}

/// The seed's own story, at a fifth of its times: the client gives up
/// after 10 s (here 2 s) while the provider takes 12 s (here 2.4 s) to
/// charge; the client retries at once, is told 409 with Retry-After, waits
/// as told, and gets the stored 201. One charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_seeds_client_that_times_out_and_retries_as_told_gets_the_one_charge() {
    let provider = Provider::start(forgetful(Duration::from_millis(2400))).await;
    let app = App::with(&provider, |s, _| {
        s.handler.timeout = Duration::from_secs(4);
        s.engine.lease = Duration::from_secs(8);
        s.engine.renew_every = Duration::from_secs(2);
    })
    .await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let send = || {
        impatient
            .post(app.url("payments"))
            .bearer_auth(super::harness::ACME_KEY)
            .header("Idempotency-Key", "order-seed")
            .body(ORDER)
            .send()
    };
    assert!(
        send().await.is_err(),
        "the first request times out on the client"
    );
    let mut answers = Vec::new();
    let last = loop {
        let r = super::harness::Reply::from(send().await.expect("an answer")).await;
        answers.push(r.status);
        if r.status != 409 || answers.len() > 20 {
            break r;
        }
        tokio::time::sleep(Duration::from_secs(r.retry_after())).await;
    };
    assert_eq!(
        answers.first(),
        Some(&409),
        "the retry while it runs: {answers:?}"
    );
    assert_eq!((last.status, last.replayed()), (201, true), "{last:?}");
    assert_eq!(provider.stats().await.charges, 1, "one charge");
}

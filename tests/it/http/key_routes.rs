//! A key belongs to its route, as at Stripe: the key that paid on
//! `/v1/payments` is refused on `/v1/refunds` (422, naming the first
//! route), sync and async alike. Queue messages share every route's keys
//! (tests/it/http/cross_transport.rs).

use super::harness::{sync_route, App, ACME_KEY};
use crate::support::kafka;
use crate::support::process::Provider;
use crate::support::unique;
use dedupq::config::RouteSettings;
use dedupq_provider::Knobs;

const BODY: &str = r#"{"amount": 100, "currency": "EUR", "recipient": "shop-1"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_that_paid_on_one_route_is_refused_on_another_naming_the_first() {
    let provider = Provider::start(Knobs::default()).await;
    let (topic, _) = kafka::topics("dqt_routes", 1).await;
    let app = App::with(&provider, |s, _| {
        s.kafka = kafka::settings(&topic, &unique("g"));
        s.api.routes.push(sync_route("refunds"));
        let later: RouteSettings = toml::from_str(&format!(
            "name = \"later\"\nmode = \"async\"\npublish = {{ to = \"kafka\", topic = \"{topic}\" }}"
        ))
        .expect("route");
        s.api.routes.push(later);
    })
    .await;
    app.wait_ready().await;

    assert_eq!(app.pay("pay-r1", BODY).await.status, 201);
    for other in ["refunds", "later"] {
        let reused = app.post(other, Some(ACME_KEY), Some("pay-r1"), BODY).await;
        assert_eq!(
            reused.problem(422),
            "urn:dedupq:problem:key-reused",
            "{other}: {reused:?}"
        );
        let detail = reused.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(detail.contains("/v1/payments"), "{other}: {detail}");
    }
    // The first route still answers with its stored result.
    let again = app.pay("pay-r1", BODY).await;
    assert_eq!((again.status, again.replayed()), (201, true));

    // Accepted on the async route and claimed by its consumer: the sync
    // route refuses it too. (Before the consumer claims it, nothing is
    // claimed: whichever route claims first owns the key, docs/http-api.md.)
    let accepted = app
        .post("later", Some(ACME_KEY), Some("pay-r2"), BODY)
        .await;
    assert_eq!(accepted.status, 202, "{accepted:?}");
    // Done, not merely claimed: the charge lands between the two.
    crate::support::eventually(std::time::Duration::from_secs(60), "settled", || async {
        (app.status("acme", "pay-r2").await.as_deref() == Some("done")).then_some(())
    })
    .await;
    let reused = app.pay("pay-r2", BODY).await;
    assert_eq!(reused.problem(422), "urn:dedupq:problem:key-reused");
    assert!(reused.text.contains("/v1/later"), "{reused:?}");
    assert_eq!(provider.stats().await.charges, 2);
}

//! An async route whose RabbitMQ raises a memory alarm. RabbitMQ then
//! blocks the API's publishing connection, and nothing written on it goes
//! out until the alarm clears: each request would wait for
//! `api.request_timeout`, holding one of `api.max_requests_in_flight`.
//! Once the broker has said it blocks the connection, a request is refused
//! at once (503 `broker-unavailable`, naming the alarm, with
//! `Retry-After`, nothing claimed); after the alarm its retry with the same
//! key is accepted and charged once. The alarm is node-wide, so the test
//! runs its own RabbitMQ node.

use super::harness::{App, ACME_KEY};
use crate::support::amqp;
use crate::support::eventually;
use crate::support::private_rabbit::PrivateRabbit;
use crate::support::process::Provider;
use dedupq::config::{QueueType, RouteSettings, SecretUrl};
use dedupq_provider::Knobs;
use std::time::Duration;

const BODY: &str = r#"{"amount": 250, "currency": "EUR", "recipient": "acct-9"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn while_rabbitmq_blocks_publishing_an_async_request_is_refused_at_once_and_its_retry_charges_once(
) {
    let rabbit = PrivateRabbit::start().await;
    let provider = Provider::start(Knobs::default()).await;
    let mut settings = amqp::settings(QueueType::Quorum);
    settings.url = SecretUrl::new(rabbit.url());
    let queue = settings.queues[0].clone();
    let app = App::with(&provider, |s, _| {
        s.amqp = settings.clone();
        s.api.request_timeout = Duration::from_secs(5);
        let route: RouteSettings = toml::from_str(&format!(
            "name = \"later\"\nmode = \"async\"\npublish = {{ to = \"amqp\", routing_key = \"{queue}\" }}"
        ))
        .expect("route");
        s.api.routes.push(route);
    })
    .await;
    app.wait_ready().await;
    let post = |key: &'static str| app.post("later", Some(ACME_KEY), Some(key), BODY);
    assert_eq!(post("pay-before").await.status, 202);

    rabbit.memory_alarm(true);
    // The first requests may wait for the broker's notice (then time out);
    // from then on each is refused at once, naming the alarm.
    let refused = eventually(
        Duration::from_secs(60),
        "a refusal naming the alarm",
        || async {
            let r = post("pay-during").await;
            let detail = r.json()["detail"].as_str().unwrap_or_default().to_string();
            detail.contains("blocks publishing").then_some(r)
        },
    )
    .await;
    assert_eq!(
        refused.problem(503),
        "urn:dedupq:problem:broker-unavailable"
    );
    assert!(refused.retry_after() >= 1);
    assert_eq!(
        app.status("acme", "pay-during").await,
        None,
        "nothing claimed"
    );

    rabbit.memory_alarm(false);
    // A request that waited for the notice may have gone out once the
    // alarm cleared: then the retry finds the key already taken.
    eventually(
        Duration::from_secs(60),
        "accepted after the alarm",
        || async {
            let r = post("pay-during").await;
            matches!(r.status, 201 | 202).then_some(())
        },
    )
    .await;
    for key in ["pay-before", "pay-during"] {
        eventually(Duration::from_secs(60), "the outcome is stored", || async {
            (app.status("acme", key).await.as_deref() == Some("done")).then_some(())
        })
        .await;
        let charges = provider.charges_for(&format!("acme:{key}")).await;
        assert_eq!(charges.len(), 1, "{key}: {charges:?}");
    }
}

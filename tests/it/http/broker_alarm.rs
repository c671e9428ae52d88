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
    let before = app
        .post("later", Some(ACME_KEY), Some("pay-before"), BODY)
        .await;
    assert_eq!(before.status, 202, "{before:?}");

    rabbit.memory_alarm(true).await;
    // RabbitMQ tells a connection it is blocked when it next publishes:
    // the first request waits for that and is not confirmed; from then on
    // each is refused at once, naming the alarm.
    let mut unconfirmed = Vec::new();
    let mut attempt = 0;
    let (key, refused) = loop {
        attempt += 1;
        assert!(attempt <= 20, "no refusal naming the alarm in 20 requests");
        let key = format!("pay-during-{attempt}");
        let r = app.post("later", Some(ACME_KEY), Some(&key), BODY).await;
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_string();
        if detail.contains("blocks publishing") {
            break (key, r);
        }
        // The only other answer: it may still be carried out.
        assert_eq!(
            r.problem(503),
            "urn:dedupq:problem:broker-unconfirmed",
            "{r:?}"
        );
        assert!(r.retry_after() >= 1);
        unconfirmed.push(key);
    };
    assert_eq!(
        refused.problem(503),
        "urn:dedupq:problem:broker-unavailable"
    );
    assert!(refused.retry_after() >= 1);
    assert_eq!(app.status("acme", &key).await, None, "nothing claimed");

    rabbit.memory_alarm(false).await;
    let accepted = eventually(
        Duration::from_secs(60),
        "accepted after the alarm",
        || async {
            let r = app.post("later", Some(ACME_KEY), Some(&key), BODY).await;
            (r.status == 202).then_some(r)
        },
    )
    .await;
    assert!(!accepted.replayed(), "{accepted:?}");
    for key in ["pay-before", key.as_str()] {
        eventually(Duration::from_secs(60), "the outcome is stored", || async {
            (app.status("acme", key).await.as_deref() == Some("done")).then_some(())
        })
        .await;
        let charges = provider.charges_for(&format!("acme:{key}")).await;
        assert_eq!(charges.len(), 1, "{key}: {charges:?}");
    }
    // What was answered "not confirmed" went out once the alarm cleared
    // (hence never "nothing is accepted"): charged at most once.
    for key in &unconfirmed {
        let charges = provider.charges_for(&format!("acme:{key}")).await;
        assert!(charges.len() <= 1, "{key}: {charges:?}");
    }
}

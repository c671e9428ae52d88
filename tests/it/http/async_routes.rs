//! Async routes: the command is published (confirmed by the broker) and
//! answered 202; the consumer claims it; a repeat gets the stored outcome.

use super::harness::{App, ACME_KEY};
use crate::support::amqp::{self, Client};
use crate::support::endpoints::endpoints;
use crate::support::kafka;
use crate::support::process::Provider;
use crate::support::{eventually, unique};
use dedupq::config::{AmqpSettings, QueueType, RouteSettings, SecretUrl};
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;

const BODY: &str = r#"{"amount": 250, "currency": "EUR", "recipient": "acct-9"}"#;

fn route(text: &str) -> RouteSettings {
    toml::from_str(text).expect("route")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_async_command_is_accepted_once_kafka_has_it_and_a_repeat_gets_the_stored_outcome() {
    let provider = Provider::start(Knobs {
        latency: Duration::from_millis(1500),
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let (topic, _) = kafka::topics("dqt_async", 1).await;
    let app = App::with(&provider, |s, _| {
        s.kafka = kafka::settings(&topic, &unique("g"));
        s.api.routes.push(route(&format!(
            "name = \"later\"\nmode = \"async\"\npublish = {{ to = \"kafka\", topic = \"{topic}\" }}"
        )));
    })
    .await;
    app.wait_ready().await;
    let post = |body: &'static str| app.post("later", Some(ACME_KEY), Some("pay-a1"), body);

    let accepted = post(BODY).await;
    assert_eq!(accepted.status, 202, "{accepted:?}");
    assert!(!accepted.replayed());
    assert_eq!(
        accepted.json(),
        json!({"status": "accepted", "idempotency_key": "pay-a1"})
    );

    eventually(
        Duration::from_secs(30),
        "the consumer claimed it",
        || async {
            (app.status("acme", "pay-a1").await.as_deref() == Some("in_progress")).then_some(())
        },
    )
    .await;
    let pending = post(BODY).await;
    assert_eq!(
        (pending.status, pending.replayed()),
        (202, true),
        "{pending:?}"
    );
    assert_eq!(
        pending.json(),
        accepted.json(),
        "the same body while pending"
    );
    let other = r#"{"amount": 999, "currency": "EUR", "recipient": "acct-9"}"#;
    assert_eq!(
        post(other).await.problem(422),
        "urn:dedupq:problem:key-reused"
    );

    eventually(Duration::from_secs(30), "the outcome is stored", || async {
        (app.status("acme", "pay-a1").await.as_deref() == Some("done")).then_some(())
    })
    .await;
    let done = post(BODY).await;
    assert_eq!((done.status, done.replayed()), (201, true), "{done:?}");
    let charges = provider.charges_for("acme:pay-a1").await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(done.json()["id"], format!("ch_{}", charges[0].id));
    assert_eq!(app.decided("kafka", "processed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_async_command_through_rabbitmq_is_charged_once_and_an_unroutable_one_is_refused() {
    let provider = Provider::start(Knobs {
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let rabbit = amqp::settings(QueueType::Quorum);
    let queue = rabbit.queues[0].clone();
    let nowhere = unique("dqt_no_such_queue");
    let app = App::with(&provider, |s, _| {
        s.amqp = rabbit.clone();
        for (name, key) in [("later", &queue), ("nowhere", &nowhere)] {
            s.api.routes.push(route(&format!(
                "name = \"{name}\"\nmode = \"async\"\npublish = {{ to = \"amqp\", routing_key = \"{key}\" }}"
            )));
        }
    })
    .await;
    app.wait_ready().await;

    let accepted = app
        .post("later", Some(ACME_KEY), Some("pay-r1"), BODY)
        .await;
    assert_eq!(accepted.status, 202, "{accepted:?}");
    eventually(Duration::from_secs(30), "the outcome is stored", || async {
        (app.status("acme", "pay-r1").await.as_deref() == Some("done")).then_some(())
    })
    .await;
    let done = app
        .post("later", Some(ACME_KEY), Some("pay-r1"), BODY)
        .await;
    assert_eq!((done.status, done.replayed()), (201, true), "{done:?}");
    assert_eq!(provider.charges_for("acme:pay-r1").await.len(), 1);
    assert_eq!(app.decided("amqp", "processed"), 1);

    let refused = app
        .post("nowhere", Some(ACME_KEY), Some("pay-r2"), BODY)
        .await;
    assert_eq!(
        refused.problem(503),
        "urn:dedupq:problem:broker-unavailable"
    );
    assert!(refused.retry_after() >= 1);
    assert_eq!(app.status("acme", "pay-r2").await, None, "nothing claimed");
    Client::connect().await.cleanup(&rabbit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_async_command_is_published_to_rabbitmq_over_amqps_trusting_the_private_ca() {
    let ep = endpoints();
    let provider = Provider::start(Knobs {
        honour_keys: false,
        ..Knobs::default()
    })
    .await;
    let rabbit = AmqpSettings {
        url: SecretUrl::new(ep.get("AMQPS_URL")),
        tls_ca_file: Some(ep.ca().into()),
        ..amqp::settings(QueueType::Quorum)
    };
    let queue = rabbit.queues[0].clone();
    let app = App::with(&provider, |s, _| {
        s.amqp = rabbit.clone();
        s.api.routes.push(route(&format!(
            "name = \"later\"\nmode = \"async\"\npublish = {{ to = \"amqp\", routing_key = \"{queue}\" }}"
        )));
    })
    .await;
    app.wait_ready().await;

    let accepted = app
        .post("later", Some(ACME_KEY), Some("pay-tls1"), BODY)
        .await;
    assert_eq!(accepted.status, 202, "{accepted:?}");
    eventually(Duration::from_secs(30), "the outcome is stored", || async {
        (app.status("acme", "pay-tls1").await.as_deref() == Some("done")).then_some(())
    })
    .await;
    assert_eq!(provider.charges_for("acme:pay-tls1").await.len(), 1);
    Client::connect().await.cleanup(&rabbit).await;
}

//! /healthz follows the loops' heartbeats, never the dependencies. A real
//! `dedupq run` consuming Kafka and RabbitMQ with `http.liveness_timeout`
//! of 2 s stays alive while idle and while intake is paused for a provider
//! outage, each for several timeouts; a zero timeout is refused at start-up
//! naming the setting. That a loop which stops beating fails /healthz,
//! naming it, is shown in src/server.rs's tests: a loop of a healthy process
//! cannot be wedged from outside it.

use crate::support::amqp::{self, Client, Msg};
use crate::support::kafka::{self, headers, produce};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq::config::QueueType;
use dedupq_provider::Knobs;
use serde_json::json;
use std::time::Duration;
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(2);

async fn healthz(dedupq: &Dedupq) -> (u16, String) {
    let r = reqwest::get(format!("http://{}/healthz", dedupq.http))
        .await
        .expect("/healthz answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// /healthz answers 200 at every look, five times a second, for `span`.
async fn alive_throughout(dedupq: &Dedupq, span: Duration, while_what: &str) {
    let end = Instant::now() + span;
    while Instant::now() < end {
        let (status, body) = healthz(dedupq).await;
        assert_eq!(status, 200, "{while_what}: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_paused_consumers_stay_alive_for_longer_than_the_liveness_timeout() {
    let (_store, store) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let (topic, _) = kafka::topics("live", 1).await;
    let queue = amqp::settings(QueueType::Classic);
    let mut config = base_config(&store, &provider);
    let section = format!(
        "topics = [\"{topic}\"]\nbrokers = \"{}\"\ngroup_id = \"{}\"\n\
         commit_interval = \"5s\"\nsession_timeout = \"6s\"",
        kafka::brokers(),
        unique("live")
    );
    config.insert("kafka".into(), toml::Value::Table(section.parse().unwrap()));
    config.insert("amqp".into(), amqp::config_section(&queue));
    let timeout = ("DEDUPQ__HTTP__LIVENESS_TIMEOUT", "2s");
    let mut dedupq = Dedupq::launch(&config, &[timeout]);
    dedupq
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("ready");

    // Idle: nothing to consume on either transport.
    alive_throughout(&dedupq, TIMEOUT * 3, "idle").await;

    // The provider in an outage: intake pauses on every transport, the
    // consumers wait on purpose, and they still beat.
    provider
        .set_knobs(json!({ "fail_rate": 1.0, "fail_retry_after": false }))
        .await;
    let producer = kafka::producer();
    let client = Client::connect().await;
    for k in 0..6 {
        let key = format!("pay-{k}");
        let body = format!(r#"{{"amount":{},"currency":"EUR"}}"#, 100 + k);
        produce(&producer, &topic, 0, &headers("t1", &key), body.as_bytes()).await;
        let msg = Msg::new("t1", &format!("amqp-{k}"), &body);
        client.publish(&queue.queues[0], &msg).await;
    }
    eventually(Duration::from_secs(20), "intake paused", || async {
        (dedupq.metric("dedupq_handler_paused").await == 1.0).then_some(())
    })
    .await;
    alive_throughout(&dedupq, TIMEOUT * 3, "paused for a provider outage").await;
    assert_eq!(dedupq.metric("dedupq_handler_paused").await, 1.0);
    assert_eq!(healthz(&dedupq).await, (200, "ok\n".to_string()));

    dedupq.kill();
    client.cleanup(&queue).await;
}

#[tokio::test]
async fn a_zero_liveness_timeout_is_refused_at_start_up_naming_the_setting() {
    let (_store, store) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let config = base_config(&store, &provider);
    let mut dedupq = Dedupq::launch(&config, &[("DEDUPQ__HTTP__LIVENESS_TIMEOUT", "0s")]);
    let status = dedupq.wait_exit(Duration::from_secs(20)).await;
    assert!(!status.success());
    let log = dedupq.log();
    assert!(
        log.contains("http.liveness_timeout") && log.contains("DEDUPQ__HTTP__LIVENESS_TIMEOUT"),
        "{log}"
    );
}

//! RabbitMQ blocks dedupq's connection: a memory or disk alarm blocks every
//! connection that publishes, and lapin then writes nothing on it (no
//! publish, no ack). The deliveries in hand are charged and stored; their
//! replies and acks wait. Nothing is lost or charged twice, the process is
//! not restarted for it (`/healthz` stays 200), and an operator sees why
//! the queue stopped: `dedupq_amqp_blocked` and the stalled queue's line
//! on `/readyz` name the alarm. The alarm is node-wide, so the test runs
//! its own RabbitMQ node.

use crate::support::amqp::{self, Client, Msg};
use crate::support::private_rabbit::PrivateRabbit;
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store};
use dedupq::config::SecretUrl;
use dedupq::transport::amqp::{AmqpSettings, QueueType};
use dedupq_provider::Knobs;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_memory_alarm_holds_replies_and_acks_names_the_block_and_loses_nothing() {
    let rabbit = PrivateRabbit::start().await;
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = isolated_store().await;
    let settings = AmqpSettings {
        url: SecretUrl::new(rabbit.url()),
        stall_after: Duration::from_secs(2),
        ..amqp::settings(QueueType::Quorum)
    };
    dedupq::transport::amqp::prepare_topology(&settings)
        .await
        .expect("queues declared");
    let client = Client::connect_to(&rabbit.url()).await;
    let replies = client.reply_queue().await;
    for i in 0..3 {
        let msg = Msg::new("acme", &format!("pay-alarm-{i}"), r#"{"amount": 1}"#)
            .reply_to(&replies, &format!("alarm-{i}"));
        client.publish(&settings.queues[0], &msg).await;
    }
    // The alarm is in effect before dedupq takes the payments: it charges
    // them, and its replies and acks are the first things it writes.
    rabbit.memory_alarm(true).await;
    let mut config = base_config(&store, &provider);
    config.insert("amqp".into(), amqp::config_section(&settings));
    let mut dedupq = Dedupq::start(&config).await;

    eventually(
        Duration::from_secs(30),
        "dedupq_amqp_blocked = 1",
        || async { (dedupq.metric("dedupq_amqp_blocked").await == 1.0).then_some(()) },
    )
    .await;
    let readyz = format!("http://{}/readyz", dedupq.http);
    let stalled = eventually(Duration::from_secs(30), "/readyz names the alarm", || {
        let readyz = readyz.clone();
        async move {
            let r = reqwest::get(&readyz).await.ok()?;
            let status = r.status().as_u16();
            let body = r.text().await.ok()?;
            (status == 503 && body.contains("RabbitMQ blocks the connection: low on memory"))
                .then_some(body)
        }
    })
    .await;
    assert!(
        stalled.contains(&settings.queues[0]),
        "the line names the queue: {stalled}"
    );
    let healthz = reqwest::get(format!("http://{}/healthz", dedupq.http))
        .await
        .expect("/healthz");
    assert_eq!(
        healthz.status().as_u16(),
        200,
        "a blocked broker is not a wedged process"
    );
    // A connection that publishes nothing is not blocked: no reply went out.
    let watcher = Client::connect_to(&rabbit.url()).await;
    assert_eq!(watcher.ready(&replies).await, 0, "no reply while blocked");

    rabbit.memory_alarm(false).await;
    let got = watcher
        .expect_exactly(&replies, 3, Duration::from_secs(60))
        .await;
    let mut ids: Vec<_> = got
        .iter()
        .filter_map(|g| g.correlation_id.clone())
        .collect();
    ids.sort();
    assert_eq!(ids, ["alarm-0", "alarm-1", "alarm-2"]);
    assert!(got
        .iter()
        .all(|g| g.header("dedupq-status").as_deref() == Some("done")));
    assert_eq!(provider.stats().await.charges, 3, "each charged once");
    eventually(Duration::from_secs(30), "unblocked and ready", || {
        let readyz = readyz.clone();
        let dedupq = &dedupq;
        async move {
            let blocked = dedupq.metric("dedupq_amqp_blocked").await;
            let ready = reqwest::get(&readyz).await.ok()?.status().is_success();
            (blocked == 0.0 && ready).then_some(())
        }
    })
    .await;
    // Stopped, the process gives back what it did not ack: nothing.
    dedupq.terminate(Duration::from_secs(30)).await;
    assert_eq!(
        watcher.ready(&settings.queues[0]).await,
        0,
        "every delivery was acked"
    );
}

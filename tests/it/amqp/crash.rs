use crate::support;
use crate::support::amqp::{self, Client, Msg};
use crate::support::process::{base_config, Dedupq, Provider};
use dedupq::transport::amqp::QueueType;
use dedupq_provider::Knobs;
use std::time::Duration;

const BODY: &str = r#"{"amount": 4200, "currency": "EUR", "recipient": "acct-1"}"#;

/// `dedupq run` on RabbitMQ; the provider charges the first request and
/// never answers it, so the process is SIGKILLed after the effect and
/// before the ack. Returns the charges made and the replies received.
async fn kill_between_effect_and_ack(honour_keys: bool) -> (i64, Vec<amqp::Got>) {
    let provider = Provider::start(Knobs {
        hang_after_charge_next: 1,
        honour_keys,
        ..Knobs::default()
    })
    .await;
    let (_, store) = support::isolated_store().await;
    let settings = amqp::settings(QueueType::Quorum);
    let mut config = base_config(&store, &provider);
    config.insert("amqp".into(), amqp::config_section(&settings));
    let mut dedupq = Dedupq::start(&config).await;
    wait_ready(&dedupq).await;

    let client = Client::connect().await;
    let replies = client.reply_queue().await;
    let msg = Msg::new("acme", "pay-crash", BODY).reply_to(&replies, "crash-1");
    client.publish(&settings.queues[0], &msg).await;
    support::eventually(Duration::from_secs(10), "the provider charged", || async {
        (provider.stats().await.charges == 1).then_some(())
    })
    .await;
    dedupq.kill();
    assert!(
        client.drain(&replies).await.is_empty(),
        "no reply before the crash"
    );

    dedupq.restart().await;
    let got = client
        .expect_exactly(&replies, 1, Duration::from_secs(30))
        .await;
    let charges = provider.stats().await.charges;
    dedupq.kill();
    client.cleanup(&settings).await;
    (charges, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_between_effect_and_ack_leaves_one_charge_and_the_stored_result_reaches_reply_to() {
    let (charges, replies) = kill_between_effect_and_ack(true).await;

    assert_eq!(charges, 1, "one charge across the crash");
    let reply = &replies[0];
    assert_eq!(reply.correlation_id.as_deref(), Some("crash-1"));
    assert_eq!(reply.header("dedupq-status").as_deref(), Some("done"));
    let result = &reply.json()["body"];
    assert_eq!(result["amount"], 4200);
    assert_eq!(result["idempotency_key"], "acme:pay-crash");
}

/// The broken variant: a provider that ignores idempotency keys charges
/// again on the retry after the crash, and the test's count sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_crash_test_catches_a_provider_that_ignores_the_derived_key() {
    let (charges, _) = kill_between_effect_and_ack(false).await;

    assert_eq!(
        charges, 2,
        "without provider idempotency the retry charges again"
    );
}

pub async fn wait_ready(dedupq: &Dedupq) {
    let url = format!("http://{}/readyz", dedupq.http);
    support::eventually(Duration::from_secs(20), "dedupq ready", || {
        let url = url.clone();
        async move {
            let r = reqwest::get(&url).await.ok()?;
            r.status().is_success().then_some(())
        }
    })
    .await;
}

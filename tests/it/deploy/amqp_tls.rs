//! RabbitMQ over TLS: `amqps://` on 5671, the broker's certificate checked
//! against `amqp.tls_ca_file`.

use crate::support::amqp::{self, Client, Msg};
use crate::support::endpoints::endpoints;
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{self};
use dedupq::config::SecretUrl;
use dedupq::transport::amqp::{AmqpSettings, QueueType};
use dedupq_provider::Knobs;
use std::time::Duration;

/// `dedupq run` consuming fresh queues over amqps, trusting `ca`.
async fn launch(ca: String) -> (Provider, AmqpSettings, Dedupq) {
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = support::isolated_store().await;
    let settings = AmqpSettings {
        url: SecretUrl::new(endpoints().get("AMQPS_URL")),
        tls_ca_file: Some(ca.into()),
        ..amqp::settings(QueueType::Quorum)
    };
    let mut config = base_config(&store, &provider);
    config.insert("amqp".into(), amqp::config_section(&settings));
    let dedupq = Dedupq::launch(&config, &[]);
    (provider, settings, dedupq)
}

#[tokio::test]
async fn dedupq_consumes_acks_and_replies_over_amqps_with_the_private_ca() {
    let (provider, settings, mut dedupq) = launch(endpoints().ca()).await;
    dedupq
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("dedupq consumes over amqps");

    let client = Client::connect().await;
    let replies = client.reply_queue().await;
    let msg = Msg::new("acme", "pay-tls", r#"{"amount":42}"#).reply_to(&replies, "c-1");
    client.publish(&settings.queues[0], &msg).await;
    client.publish(&settings.queues[0], &msg).await;
    let got = client
        .expect_exactly(&replies, 2, Duration::from_secs(30))
        .await;
    let mut outcomes: Vec<String> = got
        .iter()
        .map(|g| g.header("dedupq-outcome").unwrap_or_default())
        .collect();
    outcomes.sort();
    assert_eq!(outcomes, ["duplicate", "processed"]);
    assert_eq!(provider.charges_for("acme:pay-tls").await.len(), 1);
    support::eventually(Duration::from_secs(10), "work queue drained", || async {
        (client.ready(&settings.queues[0]).await == 0).then_some(())
    })
    .await;
    dedupq.kill();
    client.cleanup(&settings).await;
}

#[tokio::test]
async fn a_broker_certificate_from_another_ca_keeps_dedupq_unready() {
    let (_provider, _, mut dedupq) = launch(endpoints().other_ca()).await;

    let url = format!("http://{}/readyz", dedupq.http);
    let log = support::eventually(Duration::from_secs(30), "a refused TLS handshake", || {
        let (url, log) = (url.clone(), dedupq.log());
        async move {
            let r = reqwest::get(&url).await.ok()?;
            let refused = r.status() == 503 && log.contains("reconnecting");
            refused.then_some(log)
        }
    })
    .await;
    let readyz = reqwest::get(&url).await.unwrap().text().await.unwrap();
    assert!(readyz.contains("amqp down"), "{readyz}");
    assert!(log.to_lowercase().contains("certificate"), "{log}");
    assert!(dedupq.exit_status().is_none(), "it keeps retrying");
    dedupq.kill();
}

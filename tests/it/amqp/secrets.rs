use crate::support;
use crate::support::amqp;
use crate::support::process::{base_config, Dedupq, Provider};
use dedupq::config::SecretUrl;
use dedupq::transport::amqp::QueueType;
use dedupq_provider::Knobs;
use std::time::Duration;

#[tokio::test]
async fn a_failing_broker_connection_is_logged_without_the_password() {
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = support::isolated_store().await;
    let settings = dedupq::transport::amqp::AmqpSettings {
        // Nothing listens on port 1: every connect fails and is logged.
        url: SecretUrl::new("amqp://payments:s3cret-pw@127.0.0.1:1/%2f"),
        ..amqp::settings(QueueType::Quorum)
    };
    let mut config = base_config(&store, &provider);
    config.insert("amqp".into(), amqp::config_section(&settings));
    let mut dedupq = Dedupq::start(&config).await;

    let log = support::eventually(Duration::from_secs(15), "a reconnect logged", || {
        let log = dedupq.log_tail();
        async move { log.contains("reconnecting").then_some(log) }
    })
    .await;
    dedupq.kill();

    assert!(log.contains("amqp://payments:***@127.0.0.1:1"), "{log}");
    assert!(!log.contains("s3cret-pw"), "the password leaked:\n{log}");
}

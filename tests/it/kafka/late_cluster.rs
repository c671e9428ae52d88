//! A Kafka cluster that cannot be reached at start-up (restarting, or
//! started after dedupq) is waited for, not ready meanwhile, as PostgreSQL
//! is: dedupq does not exit, and consumes once a broker answers. A stop
//! while it waits is a clean stop.

use super::common::{body, TENANT};
use crate::support::forward::forward;
use crate::support::kafka::{self, headers, produce};
use crate::support::process::{base_config, free_port, Dedupq, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq_provider::Knobs;
use std::time::Duration;

/// `config` with its Kafka bootstrap moved to `port`.
fn bootstrapped_at(config: &toml::Table, port: u16) -> toml::Table {
    let mut config = config.clone();
    let kafka = config["kafka"].as_table_mut().expect("a kafka section");
    kafka.insert("brokers".into(), format!("127.0.0.1:{port}").into());
    config
}

async fn waits_for_kafka(dedupq: &Dedupq) -> String {
    eventually(
        Duration::from_secs(60),
        "/readyz saying Kafka is unreachable",
        || async {
            let (ready, text) = dedupq.readyz().await;
            (!ready && text.contains("kafka down: unreachable")).then_some(text)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_unreachable_at_start_up_is_waited_for_and_consumed_from_once_it_answers() {
    let (_store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let (topic, _) = kafka::topics("late", 1).await;
    let base = base_config(&store_settings, &provider);
    // Nothing listens on the bootstrap port until the forwarder opens it;
    // the brokers it then names are reached directly.
    let port = free_port();
    let waiting = bootstrapped_at(&kafka::with_kafka(&base, &topic, &unique("g"), ""), port);
    let mut dedupq = Dedupq::start(&waiting).await;
    let stopped = Dedupq::start(&bootstrapped_at(
        &kafka::with_kafka(&base, &topic, &unique("g"), ""),
        port,
    ))
    .await;

    // Past one metadata request's timeout (10 s), still running, not ready.
    let said = waits_for_kafka(&dedupq).await;
    waits_for_kafka(&stopped).await;
    assert!(
        dedupq.exit_status().is_none(),
        "{said}\n{}",
        dedupq.log_tail()
    );

    // A stop while waiting: status 0, never the error of a failed start.
    let mut stopped = stopped;
    stopped.signal("-TERM");
    let status = stopped.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}:\n{}", stopped.log_tail());

    let first_broker = kafka::brokers().split(',').next().unwrap().to_string();
    let forwarder = forward(port, first_broker).await;
    dedupq
        .wait_ready(Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("ready once a broker answers: {e}"));
    produce(
        &kafka::producer(),
        &topic,
        0,
        &headers(TENANT, "late-1"),
        &body(1),
    )
    .await;
    eventually(Duration::from_secs(60), "the payment charged", || async {
        let charges = provider.charges_for(&format!("{TENANT}:late-1")).await;
        (charges.len() == 1).then_some(())
    })
    .await;
    forwarder.abort();
}

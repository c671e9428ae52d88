//! Start-up refuses what would make a dead letter impossible to produce:
//! a missing dead-letter topic (unless dedupq may create it) and a
//! dead-letter suffix that makes no valid topic name.

use super::common::raw_header_str;
use super::common::TENANT;
use crate::support::kafka::{self, produce};
use crate::support::kafka_raw::read_raw;
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{isolated_store, unique};
use dedupq::transport::envelope::header as h;
use dedupq_provider::Knobs;
use std::time::Duration;

const EXIT_WITHIN: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_dead_letter_topic_stops_start_up_naming_the_setting_unless_dedupq_may_create_it()
{
    let (_store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let topic = unique("nodlq");
    kafka::create_topic(&topic, 1).await;
    let group = unique("g");
    let base = base_config(&store_settings, &provider);

    let refused = kafka::with_kafka(&base, &topic, &group, "create_topics = false");
    let (code, log) = Dedupq::run_to_exit(&refused, EXIT_WITHIN).await;
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}:\n{log}");
    assert!(log.contains("kafka.create_topics"), "{log}");
    assert!(
        log.contains(&format!("{topic}.dlq")),
        "names the topic:\n{log}"
    );

    let allowed = kafka::with_kafka(&base, &topic, &group, "create_topics = true");
    let dedupq = Dedupq::start(&allowed).await;
    let producer = kafka::producer();
    let bad = produce(
        &producer,
        &topic,
        0,
        &kafka::headers(TENANT, "k"),
        b"not json",
    )
    .await;
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(60)).await;
    let dead = read_raw(&format!("{topic}.dlq"), 1, 1, Duration::from_secs(10)).await;
    assert_eq!(raw_header_str(&dead[0], h::REASON), "not_json");
    assert_eq!(raw_header_str(&dead[0], h::SOURCE_OFFSET), bad.to_string());
    assert!(
        dedupq.log().contains("created topic"),
        "{}",
        dedupq.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_suffix_that_makes_no_valid_topic_name_stops_start_up_naming_it() {
    let (_store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let (topic, _) = kafka::topics("suffix", 1).await;
    let config = kafka::with_kafka(
        &base_config(&store_settings, &provider),
        &topic,
        &unique("g"),
        r#"dlq_suffix = "/bad""#,
    );
    let (code, log) = Dedupq::run_to_exit(&config, EXIT_WITHIN).await;
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}:\n{log}");
    assert!(log.contains("kafka.dlq_suffix"), "{log}");
    assert!(log.contains("/bad"), "{log}");
}

//! How long each kind of topic can replay. Kafka deletes a `delete` topic
//! a segment at a time, once the segment's newest record is older than
//! `retention.ms`; a segment takes records for up to `segment.ms`, so its
//! first record stays for `retention.ms` + `segment.ms` (and the broker's
//! retention check interval). A compacted topic keeps the latest record of
//! every key forever. A check of `retention.ms` alone let a keep between
//! the two through, and both kinds charged again after a purge and a group
//! reset. Start-up now refuses such a keep, naming the topic, its policy
//! and how its replay was computed.

use crate::support::process::Dedupq;
use crate::support::{isolated_store, kafka, unique};
use dedupq::config::{Settings, StoreSettings};
use dedupq::health::Health;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);
const ONE_HOUR: &str = "3600000";
const TWO_HOURS: &str = "7200000";

async fn topic_with(prefix: &str, configs: &[(&str, &str)]) -> String {
    let topic = unique(prefix);
    kafka::create_topic_with(&topic, 1, configs).await;
    topic
}

fn settings(topic: &str, keep: &str) -> Settings {
    let mut s = Settings::default();
    s.kafka.brokers = kafka::brokers();
    s.kafka.topics = vec![topic.to_string()];
    s.retention.keep = humantime::parse_duration(keep).expect("a duration").into();
    s.handler.retry_for = Duration::from_secs(600);
    s
}

/// The start-up retention check for `topic` with `keep`; the error as
/// dedupq prints it.
async fn check(settings: &Settings) -> Result<(), String> {
    dedupq::retention::keep(settings, &Health::default(), &CancellationToken::new())
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

fn assert_names(error: &str, words: &[&str]) {
    for words in words {
        assert!(error.contains(words), "{words:?} missing from:\n{error}");
    }
}

fn process_config(store: &StoreSettings, topic: &str, keep: &str) -> toml::Table {
    format!(
        "[store]\nurl = \"{url}\"\nschema = \"{schema}\"\nmax_connections = 2\n\
         [kafka]\ntopics = [\"{topic}\"]\nbrokers = \"{brokers}\"\ngroup_id = \"{group}\"\n\
         create_topics = true\n\
         [handler]\nretry_for = \"10m\"\nurl = \"http://127.0.0.1:9/charges\"\n\
         [retention]\nkeep = \"{keep}\"\nredelivery_horizon = \"10m\"\n",
        url = store.url.expose(),
        schema = store.schema.as_deref().unwrap(),
        brokers = kafka::brokers(),
        group = unique("g"),
    )
    .parse()
    .expect("valid TOML")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_topic_replays_its_retention_plus_its_segment_roll_and_a_shorter_keep_stops_start_up(
) {
    let (_store, store) = isolated_store().await;
    let topic = topic_with(
        "roll",
        &[("retention.ms", ONE_HOUR), ("segment.ms", TWO_HOURS)],
    )
    .await;

    // Longer than retention.ms, shorter than retention.ms + segment.ms.
    let mut refused = Dedupq::launch(&process_config(&store, &topic, "2h"), &[]);
    assert!(!refused.wait_exit(WAIT).await.success());
    assert_names(
        &refused.log(),
        &[
            "retention.keep",
            &topic,
            "cleanup.policy delete",
            "retention.ms 1h",
            "segment.ms 2h",
            "keeps records up to 3h",
        ],
    );

    let mut accepted = Dedupq::launch(&process_config(&store, &topic, "4h"), &[]);
    accepted.wait_ready(WAIT).await.expect("starts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_replays_forever_whatever_its_retention_ms() {
    let topic = topic_with(
        "compacted",
        &[("cleanup.policy", "compact"), ("retention.ms", ONE_HOUR)],
    )
    .await;
    for keep in ["2h", "3650days"] {
        let error = check(&settings(&topic, keep)).await.expect_err(keep);
        assert_names(
            &error,
            &[&topic, "cleanup.policy compact", "is compacted", "forever"],
        );
    }

    let mut allowed = settings(&topic, "2h");
    allowed.retention.allow_shorter_than_topics = true;
    check(&allowed).await.expect("allowed explicitly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_and_deleted_topic_is_bounded_like_a_delete_topic() {
    let topic = topic_with(
        "compactdelete",
        &[
            ("cleanup.policy", "compact,delete"),
            ("retention.ms", ONE_HOUR),
            ("segment.ms", TWO_HOURS),
        ],
    )
    .await;
    let error = check(&settings(&topic, "2h")).await.expect_err("2h");
    assert_names(
        &error,
        &[
            &topic,
            "cleanup.policy compact,delete",
            "retention.ms 1h",
            "segment.ms 2h",
        ],
    );
    check(&settings(&topic, "4h")).await.expect("4h covers it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_kept_forever_stops_start_up_whatever_the_keep() {
    let topic = topic_with("forever", &[("retention.ms", "-1")]).await;
    let error = check(&settings(&topic, "3650days"))
        .await
        .expect_err("forever");
    assert_names(&error, &[&topic, "forever (retention.ms -1)"]);
}

/// The test broker's defaults (scripts/services) and dedupq's default keep
/// must fit together, or every test that consumes a topic would be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_the_test_brokers_defaults_fits_the_default_keep() {
    let topic = topic_with("defaults", &[]).await;
    let mut s = Settings::default();
    s.kafka.brokers = kafka::brokers();
    s.kafka.topics = vec![topic];
    check(&s)
        .await
        .expect("the default keep covers the test broker");
}

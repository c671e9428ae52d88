//! Retention shorter than what the broker can replay: keys were purged
//! while the topic still held their messages, and a consumer-group reset
//! charged every payment again. Start-up refuses a `retention.keep`
//! shorter than a source topic can replay (naming the setting, the topic
//! and both durations; retention_replay.rs has each kind of topic) unless
//! `retention.allow_shorter_than_topics`; and replicas sharing a key table
//! purge with the longest keep any live one announces, so one replica's
//! short keep never purges the others'.

use crate::support::process::Dedupq;
use crate::support::{eventually, isolated_store, kafka, unique};
use dedupq::config::StoreSettings;
use dedupq::store::Store;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn store_section(store: &StoreSettings) -> String {
    format!(
        "[store]\nurl = \"{}\"\nschema = \"{}\"\nmax_connections = 2\n",
        store.url.expose(),
        store.schema.as_deref().unwrap()
    )
}

/// A topic whose broker keeps messages for 7 days, and its dead-letter topic.
async fn week_long_topic() -> String {
    let topic = unique("week");
    kafka::create_topic_with(&topic, 1, &[("retention.ms", "604800000")]).await;
    kafka::create_topic(&format!("{topic}.dlq"), 1).await;
    topic
}

fn kafka_config(store: &StoreSettings, topic: &str, allow: bool) -> toml::Table {
    let text = format!(
        "{store}[kafka]\ntopics = [\"{topic}\"]\nbrokers = \"{brokers}\"\ngroup_id = \"{group}\"\n\
         [handler]\nurl = \"http://127.0.0.1:9/charges\"\n\
         [retention]\nkeep = \"24h\"\nallow_shorter_than_topics = {allow}\n",
        store = store_section(store),
        brokers = kafka::brokers(),
        group = unique("g"),
    );
    text.parse().expect("valid TOML")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_shorter_than_a_topics_retention_stops_start_up_unless_explicitly_allowed() {
    let (_store, settings) = isolated_store().await;
    let topic = week_long_topic().await;

    let mut refused = Dedupq::launch(&kafka_config(&settings, &topic, false), &[]);
    let status = refused.wait_exit(WAIT).await;
    assert!(!status.success());
    let log = refused.log();
    for words in [
        "retention.keep",
        topic.as_str(),
        "7days",
        "1day",
        "retention.ms",
    ] {
        assert!(log.contains(words), "{words}:\n{log}");
    }

    let mut allowed = Dedupq::launch(&kafka_config(&settings, &topic, true), &[]);
    allowed.wait_ready(WAIT).await.expect("starts");
    eventually(
        WAIT,
        "a warning names the override and the topic",
        || async {
            let log = allowed.log();
            (log.contains("allowed by retention.allow_shorter_than_topics")
                && log.contains(&topic)
                && log.contains("kafka consumer subscribed"))
            .then_some(())
        },
    )
    .await;
    assert!(allowed.exit_status().is_none(), "still running");
}

/// A replica with only a store (no broker), its own keep, and purges every
/// 200 ms when it leads.
async fn replica(store: &StoreSettings, keep: &str) -> Dedupq {
    let text = format!(
        "{store}[handler]\nretry_for = \"1h\"\n\
         [retention]\nkeep = \"{keep}\"\nredelivery_horizon = \"1h\"\npurge_every = \"200ms\"\n",
        store = store_section(store),
    );
    Dedupq::start(&text.parse().expect("valid TOML")).await
}

async fn keys(store: &Store) -> Vec<String> {
    sqlx::query_scalar("SELECT key FROM dedupq_keys ORDER BY key")
        .fetch_all(store.pool())
        .await
        .unwrap()
}

/// Replicas whose upkeep connection announces a keep for this key table.
async fn announced(store: &Store) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name LIKE 'dedupq-upkeep ' || 'dedupq_keys'::regclass::oid || ' keep=%'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_different_keeps_purge_with_the_longest_one_alive() {
    let (store, settings) = isolated_store().await;
    // The short-keep replica leads (a leader that purged with its own keep
    // would take every key below).
    let short = replica(&settings, "2h").await;
    eventually(WAIT, "the short-keep replica leads", || async {
        (short.metric("dedupq_upkeep_leader").await == 1.0).then_some(())
    })
    .await;
    let mut long = replica(&settings, "48h").await;
    eventually(WAIT, "both replicas announced their keep", || async {
        (announced(&store).await == 2).then_some(())
    })
    .await;

    sqlx::query(
        "INSERT INTO dedupq_keys (tenant, key, fingerprint, fingerprint_version, status, epoch, \
         owner, attempts, created_at, completed_at) \
         SELECT 'acme', k, '\\x00', 2, 'done', 1, 'w', 1, t, t \
         FROM (VALUES ('done-3h', now() - interval '3 hours'), \
                      ('done-30h', now() - interval '30 hours'), \
                      ('done-50h', now() - interval '50 hours')) AS f (k, t)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    // The purge that took the 50 h key ran with a keep over 30 h: the
    // younger keys survive it, whichever replica leads.
    eventually(WAIT, "the key older than every keep is purged", || async {
        let left = keys(&store).await;
        (!left.contains(&"done-50h".to_string())).then_some(())
    })
    .await;
    assert_eq!(keys(&store).await, ["done-30h", "done-3h"]);

    // Control: without the long-keep replica, the same keys are purged.
    long.kill();
    eventually(
        WAIT,
        "the short keep applies once it is the only one",
        || async { keys(&store).await.is_empty().then_some(()) },
    )
    .await;
}

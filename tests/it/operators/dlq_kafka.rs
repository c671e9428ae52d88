//! `dedupq dlq list|replay kafka` against the real broker, on dead letters
//! that the Kafka transport itself wrote.

use crate::support::{self, cli, handlers::Recording, kafka};
use rdkafka::message::{Headers, Message, OwnedMessage};
use std::sync::Arc;
use std::time::Duration;

/// Headers as (name, value) pairs, in order.
fn headers(m: &OwnedMessage) -> Vec<(String, Vec<u8>)> {
    m.headers()
        .map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default()
}

fn config(topic: &str) -> std::path::PathBuf {
    let text = format!(
        "[kafka]\ntopics = [\"{topic}\"]\nbrokers = \"{}\"\n",
        kafka::brokers()
    );
    cli::config_file(&text.parse().unwrap())
}

/// The first `words` words of `field` of each line, sorted.
fn sorted(lines: &[serde_json::Value], field: &str, words: usize) -> Vec<String> {
    let mut r: Vec<String> = lines
        .iter()
        .map(|l| {
            let text = l[field].as_str().unwrap_or("-");
            text.split(' ').take(words).collect::<Vec<_>>().join(" ")
        })
        .collect();
    r.sort();
    r
}

fn reasons(lines: &[serde_json::Value]) -> Vec<String> {
    sorted(lines, "reason", 1)
}

#[tokio::test]
async fn kafka_dead_letters_are_listed_filtered_and_replayed_with_their_original_bytes() {
    let (topic, dlq) = kafka::topics("dlqcli", 1).await;
    let (store, _) = support::isolated_store().await;
    let engine = support::engine(
        &store,
        Arc::new(Recording::default()),
        support::fast_options(),
    );
    let group = support::unique("g");
    let running = kafka::Running::start(kafka::settings(&topic, &group), engine);
    let producer = kafka::producer();
    let mut poison = kafka::headers("acme", "k1");
    poison.push(("trace-id".into(), vec![0xff, 0x00, 0x7f, b'x']));
    poison.push(("empty".into(), Vec::new()));
    let original_offset = kafka::produce(&producer, &topic, 0, &poison, b"not json {").await;
    kafka::produce(
        &producer,
        &topic,
        0,
        &kafka::headers("globex", "k2"),
        b"[1, 2]",
    )
    .await;
    kafka::produce(
        &producer,
        &topic,
        0,
        &kafka::headers("acme", "k3"),
        br#"{"amount": 1}"#,
    )
    .await;
    kafka::produce(
        &producer,
        &topic,
        0,
        &kafka::headers("acme", "k3"),
        br#"{"amount": 2}"#,
    )
    .await;
    kafka::read(&dlq, 1, 3, Duration::from_secs(30)).await;
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(30)).await;
    running.stop().await;
    let config = config(&topic);
    let end_before = kafka::end_offsets(&topic, 1).await[0];

    let all = cli::run(&config, &["dlq", "list", "kafka", "--output", "json"], &[]).json_lines();
    assert_eq!(
        reasons(&all),
        ["conflict", "not_json", "not_json"],
        "{all:?}"
    );
    assert!(all.iter().all(|l| l["source"] == topic.as_str()));
    let again = cli::run(&config, &["dlq", "list", "kafka"], &[]).json_lines();
    assert_eq!(again.len(), 3, "listing consumed nothing");
    assert_eq!(
        kafka::committed("dedupq-dlq-reader", &dlq, 1).await,
        [-1],
        "the reader commits no offset"
    );

    let by_reason = cli::run(
        &config,
        &["dlq", "list", "kafka", "--reason", "conflict"],
        &[],
    )
    .json_lines();
    assert_eq!(
        (by_reason.len(), by_reason[0]["key"].as_str()),
        (1, Some("k3"))
    );
    let by_tenant = cli::run(
        &config,
        &["dlq", "list", "kafka", "--tenant", "globex"],
        &[],
    )
    .json_lines();
    assert_eq!(
        (by_tenant.len(), by_tenant[0]["key"].as_str()),
        (1, Some("k2"))
    );
    let recent = cli::run(&config, &["dlq", "list", "kafka", "--since", "10m"], &[]).json_lines();
    assert_eq!(recent.len(), 3);
    let old = cli::run(
        &config,
        &["dlq", "list", "kafka", "--until", "2020-01-01T00:00:00Z"],
        &[],
    )
    .json_lines();
    assert!(old.is_empty(), "{old:?}");
    let table = cli::run(&config, &["dlq", "list", "kafka", "--output", "table"], &[]);
    assert!(table.stdout.starts_with("LOCATION"), "{}", table.stdout);
    assert_eq!(table.stdout.lines().count(), 4, "a header and three rows");

    let wanted = ["--reason", "not_json", "--tenant", "acme"];
    let dry = cli::run(
        &config,
        &[&["dlq", "replay", "kafka"][..], &wanted].concat(),
        &[],
    );
    let planned = dry.json_lines();
    assert_eq!(planned.len(), 1);
    assert!(planned[0]["replay"]
        .as_str()
        .unwrap()
        .starts_with("would replay"));
    assert!(dry.stderr.contains("dry run"), "{}", dry.stderr);
    assert_eq!(
        kafka::end_offsets(&topic, 1).await[0],
        end_before,
        "a dry run publishes nothing"
    );

    let done = cli::run(
        &config,
        &[&["dlq", "replay", "kafka", "--execute"][..], &wanted].concat(),
        &[],
    )
    .json_lines();
    assert_eq!(done.len(), 1);
    assert!(
        done[0]["replay"]
            .as_str()
            .unwrap()
            .starts_with("replayed to"),
        "{done:?}"
    );
    assert_eq!(
        kafka::end_offsets(&topic, 1).await[0],
        end_before + 1,
        "exactly one record replayed"
    );
    let records = kafka::read(
        &topic,
        1,
        (end_before + 1) as usize,
        Duration::from_secs(20),
    )
    .await;
    let (first, replayed) = (&records[original_offset as usize], records.last().unwrap());
    assert_eq!(
        replayed.payload(),
        first.payload(),
        "the same payload bytes"
    );
    assert_eq!(replayed.key(), first.key());
    assert_eq!(
        headers(replayed),
        headers(first),
        "the original headers, in order, nothing else"
    );
    assert_eq!(headers(replayed), poison);
}

/// The `replay` field of each line of a `dlq replay` run.
fn outcomes(lines: &[serde_json::Value]) -> Vec<String> {
    sorted(lines, "replay", 2)
}

#[tokio::test]
async fn a_poison_that_fails_again_after_each_replay_is_published_once_per_replay() {
    let (topic, dlq) = kafka::topics("dlqtwice", 1).await;
    let (store, _) = support::isolated_store().await;
    let engine = support::engine(
        &store,
        Arc::new(Recording::default()),
        support::fast_options(),
    );
    let group = support::unique("g");
    let running = kafka::Running::start(kafka::settings(&topic, &group), engine);
    let producer = kafka::producer();
    kafka::produce(
        &producer,
        &topic,
        0,
        &kafka::headers("acme", "poison"),
        b"not json {",
    )
    .await;
    kafka::read(&dlq, 1, 1, Duration::from_secs(30)).await;
    let config = config(&topic);

    // Each replay publishes the poison once; it fails again and is
    // dead-lettered again beside the earlier letters.
    for (round, letters) in [(1, 1), (2, 2), (3, 3)] {
        let end_before = kafka::end_offsets(&topic, 1).await[0];
        let done = cli::run(&config, &["dlq", "replay", "kafka", "--execute"], &[]).json_lines();
        assert_eq!(done.len(), letters, "round {round}: {done:?}");
        let mut expected = vec!["replayed to".to_string()];
        expected.extend(std::iter::repeat_n("skipped: the".to_string(), letters - 1));
        expected.sort();
        assert_eq!(outcomes(&done), expected, "round {round}: {done:?}");
        assert_eq!(
            kafka::end_offsets(&topic, 1).await[0],
            end_before + 1,
            "round {round}: one record published, not one per earlier copy"
        );
        kafka::read(&dlq, 1, letters + 1, Duration::from_secs(30)).await;
    }
    let dry = cli::run(&config, &["dlq", "replay", "kafka"], &[]);
    assert_eq!(dry.json_lines().len(), 4);
    assert!(
        dry.stderr
            .contains("dry run: 1 dead letters would be replayed"),
        "{}",
        dry.stderr
    );
    running.stop().await;
}

//! Kafka plumbing of the benchmark: topics, watermarks, the committed
//! offsets of a group, and the plain consumer the raw and naive cases use.

use anyhow::{anyhow, Context};
use dedupq::broker::kafka;
use dedupq::config::KafkaSettings;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// How often every consumer of the benchmark commits (dedupq's
/// `kafka.commit_interval` and the raw and naive consumers alike).
pub(super) const COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// How often the committed offsets are looked at to stop the clock.
const WATCH_EVERY: Duration = Duration::from_millis(20);

fn settings(brokers: &str) -> KafkaSettings {
    KafkaSettings::at(brokers)
}

fn admin(brokers: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    Ok(kafka::admin(&settings(brokers)).create()?)
}

pub(super) async fn create_topic(brokers: &str, name: &str, partitions: i32) -> anyhow::Result<()> {
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for r in admin(brokers)?
        .create_topics([&topic], &AdminOptions::new())
        .await?
    {
        r.map_err(|(t, e)| anyhow!("creating topic {t}: {e}"))?;
    }
    // Wait until every partition has a leader.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (b, n) = (brokers.to_string(), name.to_string());
        let ready = tokio::task::spawn_blocking(move || {
            let md = plain(&b, "bench-meta")?.fetch_metadata(Some(&n), Duration::from_secs(2))?;
            Ok::<_, anyhow::Error>(md.topics().first().is_some_and(|t| {
                t.error().is_none()
                    && t.partitions().len() == partitions as usize
                    && t.partitions().iter().all(|p| p.leader() >= 0)
            }))
        })
        .await??;
        if ready {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "topic {name} has no leaders after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) async fn delete_topic(brokers: &str, name: &str) {
    if let Ok(a) = admin(brokers) {
        let _ = a.delete_topics(&[name], &AdminOptions::new()).await;
    }
}

fn plain(brokers: &str, group: &str) -> anyhow::Result<BaseConsumer> {
    Ok(kafka::reader(&settings(brokers), group).create()?)
}

/// High watermark of every partition.
pub(super) async fn end_offsets(
    brokers: &str,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<Vec<i64>> {
    let (b, t) = (brokers.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let c = plain(&b, "bench-meta")?;
        (0..partitions)
            .map(|p| Ok(c.fetch_watermarks(&t, p, Duration::from_secs(5))?.1))
            .collect()
    })
    .await?
}

/// Waits until `group` committed every partition of `topic` up to `end`;
/// returns when it first saw that.
pub(super) async fn committed_to_end(
    brokers: &str,
    group: &str,
    topic: &str,
    end: &[i64],
    limit: Duration,
) -> anyhow::Result<Instant> {
    let c = std::sync::Arc::new(plain(brokers, group)?);
    let mut tpl = TopicPartitionList::new();
    for p in 0..end.len() as i32 {
        tpl.add_partition(topic, p);
    }
    let deadline = Instant::now() + limit;
    loop {
        let (c2, t2, tp) = (c.clone(), topic.to_string(), tpl.clone());
        let got = tokio::task::spawn_blocking(move || {
            let got = c2.committed_offsets(tp, Duration::from_secs(5)).ok()?;
            Some(
                (0..got.count() as i32)
                    .map(|p| match got.find_partition(&t2, p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => o,
                        _ => -1,
                    })
                    .collect::<Vec<i64>>(),
            )
        })
        .await?;
        let now = Instant::now();
        if got.as_deref() == Some(end) {
            return Ok(now);
        }
        anyhow::ensure!(
            now < deadline,
            "group {group} did not commit {topic} to {end:?} within {limit:?} (at {got:?})"
        );
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

/// The consumer of the raw and naive cases, with the settings dedupq's own
/// consumer uses, so the broker side is the same for every row.
pub(super) fn consumer(brokers: &str, group: &str, topic: &str) -> anyhow::Result<StreamConsumer> {
    let c: StreamConsumer = kafka::client(&settings(brokers), "dedupq-bench")
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        .set("queued.max.messages.kbytes", "16384")
        .create()
        .context("creating the consumer")?;
    c.subscribe(&[topic])?;
    Ok(c)
}

/// Next offsets to commit, per partition.
#[derive(Default)]
pub(super) struct Positions(BTreeMap<i32, i64>);

impl Positions {
    pub(super) fn done(&mut self, partition: i32, offset: i64) {
        let e = self.0.entry(partition).or_insert(offset + 1);
        *e = (*e).max(offset + 1);
    }

    pub(super) fn commit(&self, c: &StreamConsumer, topic: &str, mode: CommitMode) {
        if self.0.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (&p, &o) in &self.0 {
            let _ = tpl.add_partition_offset(topic, p, Offset::Offset(o));
        }
        if let Err(e) = c.commit(&tpl, mode) {
            tracing::warn!(error = %dedupq::telemetry::chain(&e), "bench commit failed");
        }
    }
}

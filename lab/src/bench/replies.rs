//! The requester's side of a latency row, in the parent process: every
//! record on the reply topic, timed when it arrives, by its key (the
//! idempotency key: dedupq keys its replies by it, and the echo forwards
//! the producer's record key, which is the same).

use super::service::CASE_LIMIT;
use super::stats::now_us;
use anyhow::Context;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Arrival times (wall clock, µs) by key, as they come in.
pub(super) struct Listener {
    arrivals: watch::Receiver<HashMap<String, i64>>,
    task: JoinHandle<anyhow::Result<()>>,
}

/// Reads `topic` (all of its `partitions`) from the beginning, with a
/// consumer as a requester would run it: fetches are answered as soon as a
/// record is there.
pub(super) fn listen(brokers: &str, topic: &str, partitions: i32) -> anyhow::Result<Listener> {
    let kafka = dedupq::config::KafkaSettings::at(brokers);
    let consumer: StreamConsumer =
        dedupq::broker::kafka::reader(&kafka, &format!("{topic}-requester"))
            .create()
            .context("creating the reply consumer")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let (tx, arrivals) = watch::channel(HashMap::new());
    let task = tokio::spawn(async move {
        loop {
            let m = tokio::select! {
                m = consumer.recv() => m?,
                _ = tx.closed() => return Ok(()),
            };
            let at = now_us();
            if let Some(key) = m.key() {
                let key = String::from_utf8_lossy(key).into_owned();
                tx.send_modify(|seen| {
                    seen.entry(key).or_insert(at);
                });
            }
        }
    });
    Ok(Listener { arrivals, task })
}

impl Listener {
    /// Milliseconds from each send stamp to its key's first reply, once
    /// every key has one (or fails after a while).
    pub(super) async fn latencies(mut self, sent: &[(String, i64)]) -> anyhow::Result<Vec<f64>> {
        let deadline = Instant::now() + Duration::from_secs(30).min(CASE_LIMIT);
        let all_in = |seen: &HashMap<String, i64>| sent.iter().all(|(k, _)| seen.contains_key(k));
        let complete = tokio::time::timeout_at(deadline, self.arrivals.wait_for(all_in))
            .await
            .is_ok_and(|r| r.is_ok());
        let seen = self.arrivals.borrow().clone();
        self.task.abort();
        if !complete {
            let missing = sent.iter().filter(|(k, _)| !seen.contains_key(k)).count();
            anyhow::bail!("{missing} of {} messages got no reply", sent.len());
        }
        Ok(sent
            .iter()
            .filter_map(|(k, at)| seen.get(k).map(|r| (r - at) as f64 / 1000.0))
            .collect())
    }
}

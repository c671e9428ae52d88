//! librdkafka callbacks: rebalances (drain and commit on revoke), commit
//! confirmations, statistics (lag, broker state) and client errors.

use super::ledger::{Ledger, Tp};
use crate::health::{Component, Health};
use crate::message::Transport;
use crate::metrics::Metrics;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct Context {
    pub ledger: Arc<Ledger>,
    pub health: Health,
    pub metrics: Metrics,
    pub drain_timeout: Duration,
}

impl Context {
    pub(super) fn set_up(&self, up: bool) {
        self.health.set(Component::Kafka, up);
        self.metrics
            .broker_up
            .with_label_values(&[Transport::Kafka.label()])
            .set(up as i64);
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, tps: Vec<Tp>) {
        let deadline = Instant::now() + self.drain_timeout;
        // This runs inside the consume loop's poll; the batches it waits for
        // run on other tasks. Hand this worker's queue to another thread.
        let idle = block(|| self.ledger.wait_idle(&tps, deadline));
        if !idle {
            tracing::warn!(partitions = ?names(&tps), timeout = ?self.drain_timeout,
                "revoke: in-flight batches did not finish in time; committing what is done");
        }
        if consumer.assignment_lost() {
            // Another member may own these already: a commit could move its
            // position backwards. The uncommitted rest is redelivered.
            tracing::warn!(partitions = ?names(&tps), "assignment lost: not committing");
        } else {
            let positions = self.ledger.to_commit(Some(&tps));
            if let Err(e) = commit(consumer, &positions, CommitMode::Sync) {
                tracing::warn!(error = %e, "commit on revoke failed; uncommitted messages come back as duplicates");
            } else {
                tracing::info!(positions = ?positions, "committed on revoke");
            }
        }
        self.ledger.remove(&tps);
        for tp in &tps {
            let _ = self
                .metrics
                .consumer_lag
                .remove_label_values(&[&tp.topic, &tp.partition.to_string()]);
        }
    }
}

/// Commits `positions` (next offset to consume per partition).
pub(super) fn commit<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    positions: &[(Tp, i64)],
    mode: CommitMode,
) -> KafkaResult<()> {
    if positions.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    for (tp, offset) in positions {
        tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*offset))?;
    }
    consumer.commit(&tpl, mode)
}

/// Runs blocking librdkafka work without starving the async workers.
pub(super) fn block<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

fn tps_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| Tp {
            topic: e.topic().to_string(),
            partition: e.partition(),
        })
        .collect()
}

fn names(tps: &[Tp]) -> Vec<String> {
    tps.iter().map(Tp::to_string).collect()
}

impl ClientContext for Context {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", fac, "{message}")
            }
            L::Warning => tracing::warn!(target: "librdkafka", fac, "{message}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", fac, "{message}"),
            L::Debug => tracing::debug!(target: "librdkafka", fac, "{message}"),
        }
    }

    fn stats(&self, stats: Statistics) {
        let owned = self.ledger.owned();
        for tp in &owned {
            let lag = stats
                .topics
                .get(&tp.topic)
                .and_then(|t| t.partitions.get(&tp.partition))
                .and_then(|p| {
                    // Before the group's first commit librdkafka reports
                    // no lag; what is waiting is then everything from the
                    // log start (or from where this member started).
                    if p.consumer_lag >= 0 {
                        return Some(p.consumer_lag);
                    }
                    let from = self.ledger.started_at(tp).unwrap_or(p.lo_offset);
                    (p.hi_offset >= 0).then(|| (p.hi_offset - from.max(p.lo_offset).max(0)).max(0))
                });
            if let Some(lag) = lag {
                self.metrics
                    .consumer_lag
                    .with_label_values(&[&tp.topic, &tp.partition.to_string()])
                    .set(lag);
            }
        }
        let any_up = stats.brokers.values().any(|b| b.state == "UP");
        self.set_up(any_up);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error, KafkaError::Global(RDKafkaErrorCode::AllBrokersDown)) {
            self.set_up(false);
        }
        tracing::warn!(error = %error, reason, "kafka client error");
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let tps = tps_of(tpl);
                tracing::info!(partitions = ?names(&tps), "partitions assigned");
                self.ledger.assign(tps);
                self.set_up(true);
            }
            Rebalance::Revoke(tpl) => {
                let tps = tps_of(tpl);
                tracing::info!(partitions = ?names(&tps), "partitions revoked");
                self.revoke(consumer, tps);
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => {
                for e in offsets.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        let tp = Tp {
                            topic: e.topic().to_string(),
                            partition: e.partition(),
                        };
                        self.ledger.committed(&tp, o);
                    }
                }
            }
            // Not fatal: the next commit tick sends the same positions.
            Err(e) => tracing::warn!(error = %e, "offset commit failed"),
        }
    }
}

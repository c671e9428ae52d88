//! One poll batch: one `process` call, then each decision applied (reply
//! or dead letter confirmed first), and the durable offsets recorded.

use super::dead_letter;
use super::ledger::{Lane, Ledger};
use super::message::Held;
use super::outbox::{Outbox, Persist};
use super::reply;
use crate::engine::{Action, Decision, Incoming, Pipeline};
use crate::message::Transport;
use crate::metrics::Metrics;
use futures::future::join_all;
use std::sync::Arc;
use std::time::Duration;

/// Tries for a reply before it is given up (the outcome stays stored).
const REPLY_TRIES: u32 = 3;

/// What a batch task needs; shared by all of them.
pub(super) struct BatchContext {
    pub pipeline: Arc<dyn Pipeline>,
    pub outbox: Outbox,
    pub ledger: Arc<Ledger>,
    pub metrics: Metrics,
    pub dlq_suffix: String,
    pub dead_letter_max_bytes: usize,
    pub reply_topic: Option<String>,
}

/// Handed back to the consume loop.
pub(super) struct BatchDone {
    pub lanes: Vec<Lane>,
    /// Messages without a durable outcome, in batch order, and how long to
    /// wait before trying them again.
    pub retries: Vec<(Held, Duration)>,
    /// The store failed, or intake is paused for a provider outage:
    /// nothing of the batch is durable. Some: pause the partitions, at least
    /// this long.
    pub paused: Option<Duration>,
}

enum Applied {
    Durable,
    Retry(Duration),
    /// Shutting down before the dead letter was confirmed: not durable,
    /// and not retried by this process.
    Abandoned,
}

pub(super) async fn run(shared: Arc<BatchContext>, mut batch: Vec<Held>) -> BatchDone {
    let mut lanes: Vec<Lane> = Vec::new();
    for h in &batch {
        if !lanes.contains(&h.lane) {
            lanes.push(h.lane.clone());
        }
    }
    // Lent to the pipeline and put back, rather than copied.
    let empty = Incoming::new(crate::engine::Source::Direct { id: 0 }, Vec::new());
    let incomings: Vec<Incoming> = batch
        .iter_mut()
        .map(|h| std::mem::replace(&mut h.incoming, empty.clone()))
        .collect();
    let processed = shared.pipeline.process(&incomings).await;
    for (h, incoming) in batch.iter_mut().zip(incomings) {
        h.incoming = incoming;
    }
    let decisions = match processed {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::chain(&e), messages = batch.len(),
                "batch not processed, nothing committed; pausing");
            shared.ledger.batch_finished(&lanes, &[]);
            return BatchDone {
                lanes,
                retries: batch.into_iter().map(|h| (h, Duration::ZERO)).collect(),
                paused: Some(e.retry_after().unwrap_or_default()),
            };
        }
    };
    let applied = join_all(
        batch
            .iter()
            .zip(&decisions)
            .map(|(h, d)| apply(&shared, h, d)),
    )
    .await;
    let mut durable = Vec::new();
    let mut retries = Vec::new();
    for (held, applied) in batch.into_iter().zip(applied) {
        match applied {
            Applied::Durable => {
                shared
                    .metrics
                    .end_to_end
                    .with_label_values(&[Transport::Kafka.label()])
                    .observe(elapsed_secs(&held));
                durable.push((held.lane, held.offset));
            }
            Applied::Retry(after) => retries.push((held, after)),
            Applied::Abandoned => {}
        }
    }
    shared.ledger.batch_finished(&lanes, &durable);
    BatchDone {
        lanes,
        retries,
        paused: None,
    }
}

async fn apply(shared: &BatchContext, held: &Held, decision: &Decision) -> Applied {
    match &decision.action {
        Action::RetryLater { after } | Action::Postpone { after } => Applied::Retry(*after),
        Action::Commit { reply: None } => Applied::Durable,
        Action::Commit {
            reply: Some(result),
        } => {
            let Some(record) = shared
                .reply_topic
                .as_deref()
                .and_then(|topic| reply::record(topic, decision, result, &held.incoming))
            else {
                return Applied::Durable;
            };
            // A reply is a courtesy: the outcome is stored and a duplicate
            // replays it, so a reply that cannot be produced never holds
            // the partition.
            if let Err(e) = shared
                .outbox
                .send(&record, Persist::Tries(REPLY_TRIES))
                .await
            {
                shared
                    .metrics
                    .replies_failed
                    .with_label_values(&[Transport::Kafka.label()])
                    .inc();
                tracing::warn!(error = %crate::telemetry::chain(&e), source = %held.incoming.source,
                    "reply not delivered; the outcome stays stored");
            }
            Applied::Durable
        }
        Action::DeadLetter { reason, detail } => {
            let record = dead_letter::record(
                held,
                decision,
                reason,
                detail,
                &shared.dlq_suffix,
                shared.dead_letter_max_bytes,
            );
            match shared.outbox.send(&record, Persist::UntilConfirmed).await {
                Ok(()) => {
                    // Counted once the broker has it, not when decided.
                    shared
                        .metrics
                        .dead_letters
                        .with_label_values(&[reason.label()])
                        .inc();
                    Applied::Durable
                }
                Err(e) => {
                    tracing::warn!(error = %crate::telemetry::chain(&e), source = %held.incoming.source, "not committed");
                    Applied::Abandoned
                }
            }
        }
    }
}

fn elapsed_secs(held: &Held) -> f64 {
    (chrono::Utc::now() - held.incoming.received_at)
        .to_std()
        .unwrap_or_default()
        .as_secs_f64()
}

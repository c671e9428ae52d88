//! One poll batch: one `engine.process` call, then each decision applied
//! (reply or dead letter confirmed first), and the durable offsets recorded.

use super::dead_letter;
use super::ledger::{Lane, Ledger};
use super::message::Held;
use super::outbox::Outbox;
use super::reply;
use crate::engine::{Action, Decision, Engine, Incoming};
use crate::metrics::Metrics;
use futures::future::join_all;
use std::sync::Arc;
use std::time::Duration;

/// What a batch task needs; shared by all of them.
pub struct Shared {
    pub engine: Engine,
    pub outbox: Outbox,
    pub ledger: Arc<Ledger>,
    pub metrics: Metrics,
    pub dlq_suffix: String,
    pub reply_topic: Option<String>,
}

/// Handed back to the consume loop.
pub struct BatchDone {
    pub lanes: Vec<Lane>,
    /// Messages without a durable outcome, in batch order, and how long to
    /// wait before trying them again.
    pub retries: Vec<(Held, Duration)>,
    /// The store failed: nothing of the batch is durable.
    pub store_down: bool,
}

enum Applied {
    Durable,
    Retry(Duration),
    /// Shutting down before the dead letter or reply was confirmed: not
    /// durable, and not retried by this process.
    Abandoned,
}

pub async fn run(shared: Arc<Shared>, batch: Vec<Held>) -> BatchDone {
    let mut lanes: Vec<Lane> = Vec::new();
    for h in &batch {
        if !lanes.contains(&h.lane) {
            lanes.push(h.lane.clone());
        }
    }
    let incomings: Vec<Incoming> = batch.iter().map(|h| h.incoming.clone()).collect();
    let decisions = match shared.engine.process(&incomings).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, messages = batch.len(),
                "store unavailable: batch not processed, nothing committed; pausing");
            shared.ledger.batch_finished(&lanes, &[]);
            return BatchDone {
                lanes,
                retries: batch.into_iter().map(|h| (h, Duration::ZERO)).collect(),
                store_down: true,
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
                    .with_label_values(&["kafka"])
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
        store_down: false,
    }
}

async fn apply(shared: &Shared, held: &Held, decision: &Decision) -> Applied {
    let record = match &decision.action {
        Action::RetryLater { after } => return Applied::Retry(*after),
        Action::Commit { reply: None } => return Applied::Durable,
        Action::Commit {
            reply: Some(result),
        } => match &shared.reply_topic {
            None => return Applied::Durable,
            Some(topic) => match reply::record(topic, decision, result, &held.incoming) {
                Some(r) => r,
                None => return Applied::Durable,
            },
        },
        Action::DeadLetter { reason, detail } => {
            dead_letter::record(held, decision, reason, detail, &shared.dlq_suffix)
        }
    };
    match shared.outbox.send(&record).await {
        Ok(()) => Applied::Durable,
        Err(e) => {
            tracing::warn!(error = %e, source = %held.incoming.source, "not committed");
            Applied::Abandoned
        }
    }
}

fn elapsed_secs(held: &Held) -> f64 {
    (chrono::Utc::now() - held.incoming.received_at)
        .to_std()
        .unwrap_or_default()
        .as_secs_f64()
}

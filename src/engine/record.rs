//! What every decision leaves behind, the same for both engines: its count
//! in `dedupq_messages_total`, the "message decided" log line, and the
//! outcome on the message's span.

use super::decision::{Action, Decision, Outcome};
use super::message::Incoming;
use crate::metrics::Metrics;
use crate::telemetry::spans::BatchTrace;

/// Records the decision about every message of `batch`, in order.
pub(super) fn record(
    metrics: &Metrics,
    trace: &BatchTrace,
    batch: &[Incoming],
    decisions: &[Decision],
) {
    for (index, (msg, d)) in batch.iter().zip(decisions).enumerate() {
        metrics
            .messages
            .with_label_values(&[msg.source.transport().label(), d.outcome.label()])
            .inc();
        log(msg, d);
        trace.decided(index, d.identity.as_ref(), d.epoch, d.outcome.label());
    }
}

fn log(msg: &Incoming, d: &Decision) {
    let (tenant, key) = d
        .identity
        .as_ref()
        .map(|i| (i.tenant.as_str(), i.key.as_str()))
        .unwrap_or_default();
    let epoch = d.epoch.map(|e| e.0);
    match d.outcome {
        Outcome::Processed | Outcome::Duplicate | Outcome::InFlight => tracing::debug!(
            tenant, key, epoch, outcome = d.outcome.label(), source = %msg.source, "message decided"
        ),
        _ => tracing::info!(
            tenant, key, epoch, outcome = d.outcome.label(), source = %msg.source,
            action = %action_label(&d.action), "message decided"
        ),
    }
}

fn action_label(a: &Action) -> String {
    match a {
        Action::Commit { .. } => "commit".into(),
        Action::DeadLetter { reason, detail } => {
            format!("dead_letter({}: {detail})", reason.label())
        }
        Action::RetryLater { after } => format!("retry_later({after:?})"),
        Action::Postpone { after } => format!("postpone({after:?})"),
    }
}

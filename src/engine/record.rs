//! Metrics and log lines for every decision.

use super::core::Engine;
use super::decision::{Action, Decision, Outcome};
use super::message::Incoming;

impl Engine {
    pub(super) fn record(&self, msg: &Incoming, d: &Decision) {
        let m = &self.inner.metrics;
        let transport = msg.source.transport().label();
        m.messages
            .with_label_values(&[transport, d.outcome.label()])
            .inc();
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

//! What the engine decided for one message, for the transport to apply.

use super::message::{InvalidReason, Parsed};
use crate::fingerprint::Fingerprint;
use crate::identity::{Epoch, Identity};
use crate::store::StoredResult;
use std::time::Duration;

/// The outcome label of DESIGN section 3 (also the metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Processed,
    Duplicate,
    InFlight,
    Takeover,
    Conflict,
    Invalid,
    Failed,
    Retried,
    Unknown,
    /// The worker's write was fenced: another worker owns the key now.
    LeaseLost,
    /// The handler's answer points at dedupq's configuration (401, 404, a
    /// redirect): nothing stored, retried later.
    Fault,
}

impl Outcome {
    pub const ALL: [Outcome; 11] = [
        Outcome::Processed,
        Outcome::Duplicate,
        Outcome::InFlight,
        Outcome::Takeover,
        Outcome::Conflict,
        Outcome::Invalid,
        Outcome::Failed,
        Outcome::Retried,
        Outcome::Unknown,
        Outcome::LeaseLost,
        Outcome::Fault,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Duplicate => "duplicate",
            Outcome::InFlight => "in_flight",
            Outcome::Takeover => "takeover",
            Outcome::Conflict => "conflict",
            Outcome::Invalid => "invalid",
            Outcome::Failed => "failed",
            Outcome::Retried => "retried",
            Outcome::Unknown => "unknown",
            Outcome::LeaseLost => "lease_lost",
            Outcome::Fault => "handler_fault",
        }
    }
}

/// Why a message goes to the dead-letter topic or exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterReason {
    Invalid(InvalidReason),
    /// Same key, different operation.
    Conflict,
    /// Transient failures on every allowed attempt; the key is stored failed.
    ExhaustedRetries,
    /// Outcome still unknown after every allowed attempt; the key stays
    /// `unknown`, held for an operator to settle.
    OutcomeUnknown,
    /// Came back for a retry more often than the transport allows (a key
    /// held elsewhere for too long, a handler fault that persists).
    RetryLimit,
    /// PostgreSQL refused this message's row (not an outage): its key's
    /// outcome, if it has one, is left uncertain for the next attempt.
    StoreRejected,
}

impl DeadLetterReason {
    pub fn label(&self) -> &'static str {
        match self {
            DeadLetterReason::Invalid(r) => r.label(),
            DeadLetterReason::Conflict => "conflict",
            DeadLetterReason::ExhaustedRetries => "exhausted_retries",
            DeadLetterReason::OutcomeUnknown => "outcome_unknown",
            DeadLetterReason::RetryLimit => "retry_limit",
            DeadLetterReason::StoreRejected => "store_rejected",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_dead_letter_reason_and_fault_is_a_metric_label_from_start_up() {
        let reasons: BTreeSet<&str> = InvalidReason::LABELS
            .into_iter()
            .chain(
                [
                    DeadLetterReason::Conflict,
                    DeadLetterReason::ExhaustedRetries,
                    DeadLetterReason::OutcomeUnknown,
                    DeadLetterReason::RetryLimit,
                    DeadLetterReason::StoreRejected,
                ]
                .iter()
                .map(DeadLetterReason::label),
            )
            .collect();
        let exported: BTreeSet<&str> = crate::metrics::DEAD_LETTER_REASONS.into_iter().collect();
        assert_eq!(reasons, exported);
        let faults: BTreeSet<&str> = crate::handler::FaultReason::ALL
            .iter()
            .map(|f| f.label())
            .collect();
        let exported: BTreeSet<&str> = crate::metrics::HANDLER_FAULT_REASONS.into_iter().collect();
        assert_eq!(faults, exported);
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The outcome is durable: commit the offset / ack the delivery. The
    /// result (fresh or stored) goes to a reply destination if there is one.
    Commit { reply: Option<StoredResult> },
    /// Publish to the dead-letter destination (confirmed), then commit/ack.
    DeadLetter {
        reason: DeadLetterReason,
        detail: String,
    },
    /// Nothing durable yet: deliver this message again after `after`
    /// (Kafka: re-claim in place; RabbitMQ: through the delay queue).
    RetryLater { after: Duration },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    pub action: Action,
    pub identity: Option<Identity>,
    pub fingerprint: Option<Fingerprint>,
    pub epoch: Option<Epoch>,
}

impl Decision {
    /// A decision about a message whose identity is known.
    pub fn about(outcome: Outcome, action: Action, parsed: &Parsed) -> Self {
        Self {
            outcome,
            action,
            identity: Some(parsed.identity.clone()),
            fingerprint: Some(parsed.fingerprint.clone()),
            epoch: None,
        }
    }

    pub fn invalid(reason: InvalidReason) -> Self {
        Self {
            outcome: Outcome::Invalid,
            action: Action::DeadLetter {
                detail: reason.to_string(),
                reason: DeadLetterReason::Invalid(reason),
            },
            identity: None,
            fingerprint: None,
            epoch: None,
        }
    }
}

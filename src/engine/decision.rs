//! What the engine decided for one message, for the transport to apply.

use super::message::{InvalidReason, Parsed};
use crate::fingerprint::Fingerprint;
use crate::identity::{Epoch, Identity};
use crate::store::StoredResult;
use std::time::Duration;

/// What happened to one message: the `outcome` label of
/// `dedupq_messages_total`, as in README.md's "What happens to each
/// message".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A new key: claimed, the handler succeeded, its result stored `done`.
    Processed,
    /// The key finished before with the same fingerprint: the stored result
    /// is replayed, the handler not run.
    Duplicate,
    /// The key is held elsewhere (a live lease, a concurrent claim or
    /// transaction): retried later, nothing committed past it.
    InFlight,
    /// A key whose owner's lease had ended, taken over: the handler ran
    /// again, with the same derived key, and succeeded.
    Takeover,
    /// The key was used before with a different fingerprint: never run,
    /// dead-lettered.
    Conflict,
    /// The message cannot be processed (see [`InvalidReason`]), or
    /// PostgreSQL refused its claim: dead-lettered, no key claimed.
    Invalid,
    /// The handler failed for good (a permanent refusal, or transient
    /// failures on every allowed attempt): stored `failed`.
    Failed,
    /// The handler failed transiently: the key is released and the message
    /// retried later.
    Retried,
    /// The handler may have acted (a timeout, a lost lease, a panic): the
    /// key is recorded `unknown` and retried with the same request, or
    /// held for an operator after the last attempt. Also a message whose
    /// key is already held `unknown`: answered so and committed.
    Unknown,
    /// The worker's write was fenced: another worker owns the key now.
    LeaseLost,
    /// The handler's answer points at dedupq's configuration (401, 404, a
    /// redirect): nothing stored, retried later.
    Fault,
    /// Not run: intake is paused for a provider-wide outage (or the claim's
    /// lease could not be trusted to start a call). The key was given back
    /// without using an attempt; the message comes again later.
    Paused,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 12] = [
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
        Outcome::Paused,
    ];

    /// The `outcome` label value, e.g. `in_flight` or `handler_fault`.
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
            Outcome::Paused => "paused",
        }
    }
}

/// Why a message goes to the dead-letter topic or exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// The message cannot be processed; its label is the invalid reason's.
    Invalid(InvalidReason),
    /// Same key, different operation.
    Conflict,
    /// The key was first used on another HTTP route: a key belongs to its
    /// route, as at Stripe.
    KeyReused {
        /// The route the key was first used on.
        first_route: String,
    },
    /// Nothing reached the provider (refused, 429, 503 not processed) on
    /// every attempt `engine.max_attempts` and `handler.retry_for` allow:
    /// the key is left free, so replaying the dead letter runs the payment.
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
    /// The handler's answers kept pointing at dedupq's configuration (a
    /// 401, 404, a redirect) for `handler.retry_for`: dead-lettered before
    /// the message could outlive the keys behind it. The key is left free.
    HandlerFault,
}

impl DeadLetterReason {
    /// The `dedupq-reason` header of the dead letter, and the `reason`
    /// label of `dedupq_dead_letters_total`.
    pub fn label(&self) -> &'static str {
        match self {
            DeadLetterReason::Invalid(r) => r.label(),
            DeadLetterReason::Conflict => "conflict",
            DeadLetterReason::KeyReused { .. } => "key_reused",
            DeadLetterReason::ExhaustedRetries => "exhausted_retries",
            DeadLetterReason::OutcomeUnknown => "outcome_unknown",
            DeadLetterReason::RetryLimit => "retry_limit",
            DeadLetterReason::StoreRejected => "store_rejected",
            DeadLetterReason::HandlerFault => "handler_fault",
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
                    DeadLetterReason::KeyReused {
                        first_route: String::new(),
                    },
                    DeadLetterReason::ExhaustedRetries,
                    DeadLetterReason::OutcomeUnknown,
                    DeadLetterReason::RetryLimit,
                    DeadLetterReason::StoreRejected,
                    DeadLetterReason::HandlerFault,
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

/// What the transport does with a decided message.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The outcome is durable: commit the offset / ack the delivery. The
    /// result (fresh or stored) goes to a reply destination if there is one.
    Commit {
        /// The result to reply with.
        reply: Option<StoredResult>,
    },
    /// Publish to the dead-letter destination (confirmed), then commit/ack.
    DeadLetter {
        /// Why; the `dedupq-reason` header.
        reason: DeadLetterReason,
        /// The explanation for an operator; the `dedupq-detail` header.
        detail: String,
    },
    /// Nothing durable yet: deliver this message again after `after`
    /// (Kafka: re-claim in place; RabbitMQ: through the delay queue).
    RetryLater {
        /// How long to wait first.
        after: Duration,
    },
    /// Nothing was attempted (intake paused for a provider outage): deliver
    /// the message again after `after`, as `RetryLater`, but without
    /// counting a retry against the transport's limit.
    Postpone {
        /// How long to wait first.
        after: Duration,
    },
}

/// The engine's decision about one message: what happened, and what the
/// transport does next.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What happened (the metrics label).
    pub outcome: Outcome,
    /// What the transport does next.
    pub action: Action,
    /// The message's tenant and key; None when the message could not be
    /// read.
    pub identity: Option<Identity>,
    /// The message's fingerprint, when the decision is about its key (the
    /// dead letter's `dedupq-fingerprint` header).
    pub fingerprint: Option<Fingerprint>,
    /// The fencing epoch of the claim whose handler ran (leased engine
    /// only); None otherwise.
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

    /// The dead letter of a message that cannot be processed: outcome
    /// `invalid`, reason and detail from `reason`.
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

//! The rules that turn a handler's outcome into what is stored for the key
//! and what happens to the message. The one place that decides done,
//! failed, retried, unknown or held.

use super::claimed::Owned;
use super::core::Engine;
use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use crate::handler::{HandlerOutcome, HandlerResult};
use crate::health::Component;
use crate::store::{Answer, Finish, KeyStatus, StoredResult};
use serde_json::json;

/// What one finished handler run leads to.
pub(super) struct Verdict {
    pub finish: Finish,
    pub decision: Decision,
}

impl Engine {
    pub(super) fn judge(&self, owned: &Owned<'_>, out: HandlerOutcome) -> Verdict {
        let opts = &self.inner.options;
        let attempts = owned.claim.attempts.max(1) as u32;
        let last = attempts >= opts.max_attempts;
        let retry = Action::RetryLater {
            after: opts.backoff.after_attempt(attempts),
        };
        // After an attempt whose outcome is unknown, only an answer about
        // that first request settles the key: anything short of a success
        // or a definitive refusal leaves it unknown.
        let out = match out {
            HandlerOutcome::Transient { error, .. } if owned.claim.uncertain => {
                HandlerOutcome::Unknown { error }
            }
            other => other,
        };
        if !matches!(out, HandlerOutcome::Fault { .. }) {
            self.inner.health.set(Component::Handler, true);
        }
        let (finish, outcome, action) = match out {
            HandlerOutcome::Success(r) => {
                let stored = stored(KeyStatus::Done, &r);
                (Finish::Done(answer(r)), owned.fresh, commit(stored))
            }
            HandlerOutcome::Permanent(r) => {
                let stored = stored(KeyStatus::Failed, &r);
                (Finish::Failed(answer(r)), Outcome::Failed, commit(stored))
            }
            HandlerOutcome::Transient { status, error } if last => {
                let body =
                    json!({ "error": error, "attempts": attempts, "reason": "exhausted_retries" });
                let r = HandlerResult::json(status.unwrap_or(0), &body);
                let action = Action::DeadLetter {
                    reason: DeadLetterReason::ExhaustedRetries,
                    detail: format!("{attempts} attempts failed; last error: {error}"),
                };
                (Finish::Failed(answer(r)), Outcome::Failed, action)
            }
            HandlerOutcome::Transient { error, .. } => (
                Finish::Release {
                    error,
                    refund: false,
                },
                Outcome::Retried,
                retry,
            ),
            HandlerOutcome::Unknown { error } if last => {
                let action = Action::DeadLetter {
                    reason: DeadLetterReason::OutcomeUnknown,
                    detail: format!(
                        "outcome unknown after {attempts} attempts, held for an operator \
                         (dedupq keys settle): {error}"
                    ),
                };
                let finish = Finish::Unknown {
                    error,
                    hold: true,
                    refund: false,
                };
                (finish, Outcome::Unknown, action)
            }
            HandlerOutcome::Unknown { error } => (
                Finish::Unknown {
                    error,
                    hold: false,
                    refund: false,
                },
                Outcome::Unknown,
                retry,
            ),
            HandlerOutcome::Fault { reason, error, .. } => {
                self.inner
                    .metrics
                    .handler_faults
                    .with_label_values(&[reason.label()])
                    .inc();
                self.inner.health.set(Component::Handler, false);
                tracing::warn!(identity = %owned.pending.parsed.identity, reason = reason.label(), %error,
                    "handler fault: the answer points at dedupq's configuration; nothing stored, retrying");
                // A fault says nothing about the payment: the attempt is
                // given back, and an uncertain key stays unknown.
                let finish = if owned.claim.uncertain {
                    Finish::Unknown {
                        error,
                        hold: false,
                        refund: true,
                    }
                } else {
                    Finish::Release {
                        error,
                        refund: true,
                    }
                };
                (finish, Outcome::Fault, retry)
            }
        };
        let mut decision = Decision::about(outcome, action, &owned.pending.parsed);
        decision.epoch = Some(owned.claim.epoch);
        Verdict { finish, decision }
    }
}

fn answer(r: HandlerResult) -> Answer {
    Answer {
        status: r.status,
        body: r.body,
        content_type: r.content_type,
    }
}

fn stored(status: KeyStatus, r: &HandlerResult) -> StoredResult {
    StoredResult {
        status,
        result_status: r.status,
        body: r.body.clone(),
        content_type: r.content_type.clone(),
    }
}

fn commit(stored: StoredResult) -> Action {
    Action::Commit {
        reply: Some(stored),
    }
}

//! The rules that turn a handler's outcome into what is stored for the key
//! and what happens to the message. The one place that decides done,
//! failed, retried, unknown or held.

use super::claimed::{Owned, Ran, Skip};
use super::core::Engine;
use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::provider_gate::Signal;
use crate::handler::{HandlerOutcome, HandlerResult};
use crate::health::Component;
use crate::store::{Answer, Finish, KeyStatus, StoredResult};
use std::time::Duration;

/// What one finished handler run leads to.
pub(super) struct Verdict {
    pub finish: Finish,
    pub decision: Decision,
}

/// Keys whose uncounted retries are remembered at most (a fault of a
/// whole deployment should not grow memory without bound).
const STREAKS_KEPT: usize = 10_000;

impl Engine {
    pub(super) fn judge(&self, owned: &Owned<'_>, ran: Ran) -> Verdict {
        let (out, probe) = match ran {
            Ran::Called { outcome, probe } => (outcome, probe),
            Ran::Skipped(skip) => return self.skipped(owned, skip),
        };
        // A probe that finds the provider still down tells about the
        // provider, not the payment: it uses no attempt.
        let probe_failed = probe && !matches!(Signal::of(&out), Signal::Answered);
        let opts = &self.inner.options;
        let claim = &owned.claim;
        let identity = &owned.pending.parsed.identity;
        let attempts = claim.attempts.max(1) as u32;
        // Time paused for a provider outage is not the payment's.
        let active = claim
            .age
            .saturating_sub(self.inner.gate.paused_within(claim.age));
        let out_of_time = active >= opts.retry_for && !probe_failed;
        let last = (attempts >= opts.max_attempts && !probe_failed) || out_of_time;
        // Retries that use no attempt (a fault, a provider still working on
        // the key: 409) back off on a streak of their own. A provider that
        // says "still working" for as many tries as the attempts allow is
        // stuck: from then on its 409s count.
        let is_409 = matches!(
            out,
            HandlerOutcome::Transient {
                status: Some(409),
                ..
            }
        );
        let uncounted = is_409 || matches!(out, HandlerOutcome::Fault { .. });
        let streak = self.streak(identity, uncounted);
        let still_running = is_409 && streak <= opts.max_attempts;
        // After an attempt whose outcome is unknown, only an answer about
        // that first request settles the key: anything short of a success
        // or a definitive refusal leaves it unknown.
        let out = match out {
            HandlerOutcome::Transient { error, .. } if claim.uncertain && !still_running => {
                HandlerOutcome::Unknown { error }
            }
            other => other,
        };
        // An answer about the payment clears a fault (the gate reports an
        // outage of its own, until a probe is answered).
        let answered = matches!(
            out,
            HandlerOutcome::Success(_) | HandlerOutcome::Permanent(_)
        );
        if answered && self.inner.gate.paused().is_none() {
            self.inner.health.set(Component::Handler, true);
        }
        let retry = |retry_after: Option<Duration>| Action::RetryLater {
            after: opts
                .backoff
                .after_attempt(attempts.saturating_add(streak))
                .max(retry_after.unwrap_or_default()),
        };
        let spent = || {
            format!(
                "{attempts} attempts over {}",
                humantime::format_duration(Duration::from_secs(active.as_secs()))
            )
        };
        let (finish, outcome, action) = match out {
            HandlerOutcome::Success(r) => {
                let stored = stored(KeyStatus::Done, &r);
                (Finish::Done(answer(r)), owned.fresh, commit(stored))
            }
            HandlerOutcome::Permanent(r) => {
                let stored = stored(KeyStatus::Failed, &r);
                (Finish::Failed(answer(r)), Outcome::Failed, commit(stored))
            }
            // The provider still works on the key (or, for a first attempt,
            // on a request of another process): this attempt did nothing.
            HandlerOutcome::Transient {
                error, retry_after, ..
            } if still_running && !out_of_time => {
                let finish = if claim.uncertain {
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
                (finish, Outcome::Retried, retry(retry_after))
            }
            // Nothing ever reached the provider: the key is left free, so
            // replaying the dead letter runs the payment. Never failed.
            HandlerOutcome::Transient { error, .. } if last => {
                let action = Action::DeadLetter {
                    reason: DeadLetterReason::ExhaustedRetries,
                    detail: format!(
                        "nothing reached the provider in {}; the key is free: replaying this \
                         message runs the payment. Last error: {error}",
                        spent()
                    ),
                };
                let finish = Finish::Release {
                    error,
                    refund: false,
                };
                (finish, Outcome::Retried, action)
            }
            HandlerOutcome::Transient {
                error, retry_after, ..
            } => (
                Finish::Release {
                    error,
                    refund: false,
                },
                Outcome::Retried,
                retry(retry_after),
            ),
            HandlerOutcome::Unknown { error } if last => {
                let action = Action::DeadLetter {
                    reason: DeadLetterReason::OutcomeUnknown,
                    detail: format!(
                        "outcome unknown after {}, held for an operator (dedupq keys settle): \
                         {error}",
                        spent()
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
                retry(None),
            ),
            HandlerOutcome::Fault { reason, error, .. } => {
                self.inner
                    .metrics
                    .handler_faults
                    .with_label_values(&[reason.label()])
                    .inc();
                self.inner.health.set(Component::Handler, false);
                tracing::warn!(%identity, reason = reason.label(), %error, streak,
                    "handler fault: the answer points at dedupq's configuration; nothing stored, retrying");
                self.faulted(claim.uncertain, error, out_of_time, spent(), retry(None))
            }
        };
        let finish = if probe_failed {
            refunded(finish)
        } else {
            finish
        };
        let mut decision = Decision::about(outcome, action, &owned.pending.parsed);
        decision.epoch = Some(claim.epoch);
        Verdict { finish, decision }
    }

    /// A fault says nothing about the payment: the attempt is given back
    /// and an uncertain key stays unknown. Past `handler.retry_for` the
    /// message is dead-lettered, before it could outlive the keys behind it
    /// in its partition (whose retention runs meanwhile).
    fn faulted(
        &self,
        uncertain: bool,
        error: String,
        out_of_time: bool,
        spent: String,
        retry: Action,
    ) -> (Finish, Outcome, Action) {
        match (uncertain, out_of_time) {
            (true, true) => (
                Finish::Unknown {
                    error: error.clone(),
                    hold: true,
                    refund: true,
                },
                Outcome::Unknown,
                Action::DeadLetter {
                    reason: DeadLetterReason::OutcomeUnknown,
                    detail: format!(
                        "outcome unknown, and the handler kept faulting for {spent}: held for an \
                         operator (dedupq keys settle): {error}"
                    ),
                },
            ),
            (false, true) => (
                Finish::Release {
                    error: error.clone(),
                    refund: true,
                },
                Outcome::Fault,
                Action::DeadLetter {
                    reason: DeadLetterReason::HandlerFault,
                    detail: format!(
                        "the handler's answers pointed at dedupq's configuration for {spent}; \
                         nothing was charged and the key is free: fix the configuration and \
                         replay this message. Last answer: {error}"
                    ),
                },
            ),
            (true, false) => (
                Finish::Unknown {
                    error,
                    hold: false,
                    refund: true,
                },
                Outcome::Fault,
                retry,
            ),
            (false, false) => (
                Finish::Release {
                    error,
                    refund: true,
                },
                Outcome::Fault,
                retry,
            ),
        }
    }

    /// A call that never started: the key is given back without using an
    /// attempt (an uncertain key stays unknown).
    fn skipped(&self, owned: &Owned<'_>, skip: Skip) -> Verdict {
        let (outcome, action, error) = match skip {
            Skip::Paused(after) => (
                Outcome::Paused,
                Action::Postpone { after },
                "not called: intake paused for a provider outage",
            ),
            Skip::LeaseInDoubt => (
                Outcome::LeaseLost,
                Action::RetryLater {
                    after: self.inner.options.backoff.min,
                },
                "not called: the lease may have ended before the call",
            ),
        };
        let error = error.to_string();
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
        let mut decision = Decision::about(outcome, action, &owned.pending.parsed);
        decision.epoch = Some(owned.claim.epoch);
        Verdict { finish, decision }
    }

    /// The key's streak of uncounted retries, after this one (`counts`:
    /// one more; else the streak ends).
    fn streak(&self, identity: &crate::identity::Identity, counts: bool) -> u32 {
        let mut streaks = self.inner.streaks.lock().unwrap_or_else(|e| e.into_inner());
        if !counts {
            streaks.remove(identity);
            return 0;
        }
        if streaks.len() >= STREAKS_KEPT && !streaks.contains_key(identity) {
            streaks.clear();
        }
        let n = streaks.entry(identity.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }
}

/// The same finish, giving its attempt back.
fn refunded(finish: Finish) -> Finish {
    match finish {
        Finish::Release { error, .. } => Finish::Release {
            error,
            refund: true,
        },
        Finish::Unknown { error, hold, .. } => Finish::Unknown {
            error,
            hold,
            refund: true,
        },
        settled => settled,
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

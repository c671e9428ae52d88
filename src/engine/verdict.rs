//! The rules that turn a handler run into what is stored for the key and
//! what happens to the message: the one place that decides done, failed,
//! retried, unknown or held. Pure: the engine gathers the facts about the
//! claim and applies the verdict.

use super::batch::{Ran, Skip};
use super::decision::{Action, DeadLetterReason, Outcome};
use super::options::EngineOptions;
use super::provider_gate::Signal;
use super::settle::stored;
use super::streaks::Streak;
use crate::backoff::Backoff;
use crate::handler::{HandlerOutcome, HandlerResult};
use crate::store::{Answer, Finish, KeyStatus, Refund, StoredResult};
use std::time::Duration;

/// What is known about the claim whose handler ran.
pub(super) struct Facts {
    /// Attempts on the key that count towards `engine.max_attempts`, this
    /// one included (at least 1).
    pub attempts: u32,
    /// An earlier attempt's outcome is unknown.
    pub uncertain: bool,
    /// `Processed` for a new key, `Takeover` for one taken over.
    pub fresh: Outcome,
    /// How long the key's attempts have gone on, time paused for a
    /// provider outage not counted.
    pub active: Duration,
    /// Retries in a row that used no attempt, this one included (see
    /// [`uses_no_attempt`]), and how long since the first of them.
    pub streak: Streak,
}

/// How long a provider's "still working on this key" (409) is believed:
/// a request that runs longer is stuck, and from then on its 409s count as
/// attempts (the key is held `unknown` when they run out).
pub(super) const STILL_WORKING_FOR: Duration = Duration::from_secs(300);

/// What one handler run leads to: what is stored for the key, and what
/// happens to the message.
pub(super) struct Verdict {
    pub finish: Finish,
    pub outcome: Outcome,
    pub action: Action,
}

/// Where a run stands among the key's attempts.
struct Standing {
    attempts: u32,
    streak: u32,
    uncertain: bool,
    active: Duration,
    backoff: Backoff,
    /// `handler.retry_for` is used up.
    out_of_time: bool,
    /// The attempts or `handler.retry_for` are used up.
    last: bool,
    /// A 409: the provider still works on the key.
    still_running: bool,
}

/// Whether a retry after `outcome` uses no attempt (a fault, a provider
/// still working on the key: 409); such retries back off on a streak.
pub(super) fn uses_no_attempt(outcome: &HandlerOutcome) -> bool {
    is_409(outcome) || matches!(outcome, HandlerOutcome::Fault { .. })
}

/// The verdict on a run of the claim `facts` describe.
pub(super) fn judge(facts: &Facts, ran: Ran, opts: &EngineOptions) -> Verdict {
    match ran {
        Ran::Called { outcome, probe } => called(facts, outcome, probe, opts),
        Ran::Skipped(skip) => skipped(skip, facts.uncertain, opts.backoff),
    }
}

fn called(facts: &Facts, out: HandlerOutcome, probe: bool, opts: &EngineOptions) -> Verdict {
    // A probe that finds the provider still down tells about the
    // provider, not the payment: it uses no attempt.
    let probe_failed = probe && !matches!(Signal::of(&out), Signal::Answered);
    let at = Standing::new(facts, &out, probe_failed, opts);
    // After an attempt whose outcome is unknown, only an answer about
    // that first request settles the key: anything short of a success or
    // a definitive refusal leaves it unknown.
    let out = match out {
        HandlerOutcome::Transient { error, .. } if at.uncertain && !at.still_running => {
            HandlerOutcome::Unknown { error }
        }
        other => other,
    };
    let (finish, outcome, action) = match out {
        HandlerOutcome::Success(r) => {
            let reply = stored(KeyStatus::Done, r.clone());
            (Finish::Done(answer(r)), facts.fresh, commit(reply))
        }
        HandlerOutcome::Permanent(r) => {
            let reply = stored(KeyStatus::Failed, r.clone());
            (Finish::Failed(answer(r)), Outcome::Failed, commit(reply))
        }
        HandlerOutcome::Transient {
            error, retry_after, ..
        } => transient(&at, error, retry_after),
        HandlerOutcome::Unknown { error } => unknown(&at, error),
        HandlerOutcome::Fault { error, .. } => faulted(&at, error),
    };
    let finish = if probe_failed {
        uncounted(finish)
    } else {
        finish
    };
    Verdict {
        finish,
        outcome,
        action,
    }
}

fn transient(
    at: &Standing,
    error: String,
    retry_after: Option<Duration>,
) -> (Finish, Outcome, Action) {
    // The provider still works on the key (or, for a first attempt, on a
    // request of another process): this attempt did nothing.
    if at.still_running && !at.out_of_time {
        let finish = give_back(at.uncertain, error, Refund::Uncounted);
        return (finish, Outcome::Retried, at.retry(retry_after));
    }
    // Nothing ever reached the provider: the key is left free, so
    // replaying the dead letter runs the payment. Never failed.
    let action = if at.last {
        Action::DeadLetter {
            reason: DeadLetterReason::ExhaustedRetries,
            detail: format!(
                "nothing reached the provider in {}; the key is free: replaying this \
                 message runs the payment. Last error: {error}",
                at.spent()
            ),
        }
    } else {
        at.retry(retry_after)
    };
    let finish = Finish::Release {
        error,
        refund: Refund::No,
    };
    (finish, Outcome::Retried, action)
}

fn unknown(at: &Standing, error: String) -> (Finish, Outcome, Action) {
    let action = if at.last {
        Action::DeadLetter {
            reason: DeadLetterReason::OutcomeUnknown,
            detail: format!(
                "outcome unknown after {}, held for an operator (dedupq keys settle): {error}",
                at.spent()
            ),
        }
    } else {
        at.retry(None)
    };
    let finish = Finish::Unknown {
        error,
        hold: at.last,
        refund: Refund::No,
    };
    (finish, Outcome::Unknown, action)
}

/// A fault says nothing about the payment: the attempt is given back and
/// an uncertain key stays unknown. Past `handler.retry_for` the message is
/// dead-lettered, before it could outlive the keys behind it in its
/// partition (whose retention runs meanwhile).
fn faulted(at: &Standing, error: String) -> (Finish, Outcome, Action) {
    if !at.out_of_time {
        return (
            give_back(at.uncertain, error, Refund::Uncounted),
            Outcome::Fault,
            at.retry(None),
        );
    }
    let spent = at.spent();
    if at.uncertain {
        let detail = format!(
            "outcome unknown, and the handler kept faulting for {spent}: held for an \
             operator (dedupq keys settle): {error}"
        );
        let finish = Finish::Unknown {
            error,
            hold: true,
            refund: Refund::Uncounted,
        };
        let reason = DeadLetterReason::OutcomeUnknown;
        return (
            finish,
            Outcome::Unknown,
            Action::DeadLetter { reason, detail },
        );
    }
    let detail = format!(
        "the handler's answers pointed at dedupq's configuration for {spent}; \
         nothing was charged and the key is free: fix the configuration and \
         replay this message. Last answer: {error}"
    );
    let reason = DeadLetterReason::HandlerFault;
    (
        give_back(false, error, Refund::Uncounted),
        Outcome::Fault,
        Action::DeadLetter { reason, detail },
    )
}

/// A call that never started: the key is given back without using an
/// attempt (an uncertain key stays unknown).
fn skipped(skip: Skip, uncertain: bool, backoff: Backoff) -> Verdict {
    let (outcome, action, error) = match skip {
        Skip::Paused(after) => (
            Outcome::Paused,
            Action::Postpone { after },
            "not called: intake paused for a provider outage",
        ),
        Skip::LeaseInDoubt => (
            Outcome::LeaseLost,
            Action::RetryLater { after: backoff.min },
            "not called: the lease may have ended before the call",
        ),
    };
    Verdict {
        finish: give_back(uncertain, error.to_string(), Refund::Unsent),
        outcome,
        action,
    }
}

impl Standing {
    fn new(facts: &Facts, out: &HandlerOutcome, probe_failed: bool, opts: &EngineOptions) -> Self {
        let out_of_time = facts.active >= opts.retry_for && !probe_failed;
        Self {
            attempts: facts.attempts,
            streak: facts.streak.count,
            uncertain: facts.uncertain,
            active: facts.active,
            backoff: opts.backoff,
            out_of_time,
            last: (facts.attempts >= opts.max_attempts && !probe_failed) || out_of_time,
            still_running: is_409(out) && facts.streak.lasted < STILL_WORKING_FOR,
        }
    }

    /// Retry after the backoff of this attempt and streak, or later if the
    /// provider asked so.
    fn retry(&self, retry_after: Option<Duration>) -> Action {
        let after = self
            .backoff
            .after_attempt(self.attempts.saturating_add(self.streak))
            .max(retry_after.unwrap_or_default());
        Action::RetryLater { after }
    }

    /// The attempts and time spent, for a dead letter's detail.
    fn spent(&self) -> String {
        format!(
            "{} attempts over {}",
            self.attempts,
            humantime::format_duration(Duration::from_secs(self.active.as_secs()))
        )
    }
}

fn is_409(outcome: &HandlerOutcome) -> bool {
    matches!(
        outcome,
        HandlerOutcome::Transient {
            status: Some(409),
            ..
        }
    )
}

/// The key given back without using an attempt (`refund` says whether a
/// request went out): released, or left unknown if an earlier attempt's
/// outcome is.
fn give_back(uncertain: bool, error: String, refund: Refund) -> Finish {
    if uncertain {
        Finish::Unknown {
            error,
            hold: false,
            refund,
        }
    } else {
        Finish::Release { error, refund }
    }
}

/// The same finish, its attempt not counted. Its request went out, so it
/// keeps its number.
fn uncounted(finish: Finish) -> Finish {
    match finish {
        Finish::Release { error, .. } => Finish::Release {
            error,
            refund: Refund::Uncounted,
        },
        Finish::Unknown { error, hold, .. } => Finish::Unknown {
            error,
            hold,
            refund: Refund::Uncounted,
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

fn commit(stored: StoredResult) -> Action {
    Action::Commit {
        reply: Some(stored),
    }
}

#[cfg(test)]
mod tests;

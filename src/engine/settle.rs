//! The decisions both engines share: one table for a claim that settles
//! its message without running it, the retry limit every transport sets,
//! and the stored result of a handler's answer.

use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::message::{Incoming, Parsed};
use crate::backoff::Backoff;
use crate::handler::HandlerResult;
use crate::store::{ClaimResult, KeyStatus, StoredResult};

/// The decision for a claim that did not make this worker the owner, the
/// same in both engines. (`Won` and `TakenOver` never come here; they
/// would only be looked at again soon.)
pub(super) fn settled(result: ClaimResult, parsed: &Parsed, backoff: Backoff) -> Decision {
    let (outcome, action) = match result {
        ClaimResult::Duplicate(stored) => (
            Outcome::Duplicate,
            Action::Commit {
                reply: Some(stored),
            },
        ),
        // Answered, committed and counted; never run again on its own.
        ClaimResult::HeldUnknown { .. } => (
            Outcome::Unknown,
            Action::Commit {
                reply: Some(StoredResult::unknown()),
            },
        ),
        ClaimResult::Held { lease_left } => (
            Outcome::InFlight,
            Action::RetryLater {
                after: backoff.for_held(lease_left),
            },
        ),
        // Another transaction holds the row: only this key waits.
        ClaimResult::Locked => (
            Outcome::InFlight,
            Action::RetryLater {
                after: backoff.for_held(backoff.max),
            },
        ),
        ClaimResult::OtherRoute { first } => (
            Outcome::Conflict,
            Action::DeadLetter {
                detail: format!("this key was first used on the route /v1/{first}"),
                reason: DeadLetterReason::KeyReused { first_route: first },
            },
        ),
        ClaimResult::Conflict => (
            Outcome::Conflict,
            Action::DeadLetter {
                reason: DeadLetterReason::Conflict,
                detail: "this key was already used for a different operation \
                         (the fingerprint differs)"
                    .into(),
            },
        ),
        ClaimResult::Contended | ClaimResult::Won(_) | ClaimResult::TakenOver(_) => {
            return Decision {
                identity: Some(parsed.identity.clone()),
                ..retry_soon(backoff, Outcome::InFlight)
            }
        }
    };
    Decision::about(outcome, action, parsed)
}

/// Nothing decided yet: look again after the shortest backoff.
pub(super) fn retry_soon(backoff: Backoff, outcome: Outcome) -> Decision {
    Decision {
        outcome,
        action: Action::RetryLater { after: backoff.min },
        identity: None,
        fingerprint: None,
        epoch: None,
    }
}

/// A message that would come back once more than its transport allows is
/// dead-lettered instead (its key, if claimed, was released or stays
/// unknown: nothing about it is lost).
pub(super) fn limit_retries(msg: &Incoming, decision: Decision) -> Decision {
    match (&decision.action, msg.retry_limit) {
        (Action::RetryLater { .. }, Some(limit)) if msg.retries >= limit => {
            let detail = format!(
                "still '{}' after coming back {} times",
                decision.outcome.label(),
                msg.retries
            );
            Decision {
                action: Action::DeadLetter {
                    reason: DeadLetterReason::RetryLimit,
                    detail,
                },
                ..decision
            }
        }
        _ => decision,
    }
}

/// What is stored (and replayed) for a handler's answer.
pub(super) fn stored(status: KeyStatus, r: HandlerResult) -> StoredResult {
    StoredResult {
        status,
        result_status: r.status,
        body: r.body,
        content_type: r.content_type,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Parser, Source};
    use std::time::Duration;

    const BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));

    fn parsed() -> Parsed {
        let msg = Incoming::new(Source::Direct { id: 1 }, "{}")
            .with_header("client-id", "acme")
            .with_header("idempotency-key", "k1");
        Parser::new(&Default::default()).parse(&msg).unwrap()
    }

    fn decide(result: ClaimResult) -> Decision {
        settled(result, &parsed(), BACKOFF)
    }

    #[test]
    fn a_finished_key_commits_and_replies_with_its_stored_result() {
        let stored = stored(
            KeyStatus::Done,
            HandlerResult::json(201, &serde_json::json!("ok")),
        );
        let d = decide(ClaimResult::Duplicate(stored.clone()));
        assert_eq!(d.outcome, Outcome::Duplicate);
        assert_eq!(
            d.action,
            Action::Commit {
                reply: Some(stored)
            }
        );
        assert_eq!(d.identity, Some(parsed().identity));
        let d = decide(ClaimResult::HeldUnknown { attempts: 3 });
        assert_eq!(d.outcome, Outcome::Unknown);
        let reply = Some(StoredResult::unknown());
        assert_eq!(d.action, Action::Commit { reply });
    }

    #[test]
    fn a_held_key_waits_at_most_until_its_lease_ends_and_a_locked_row_a_while() {
        let after = |d: Decision| match d.action {
            Action::RetryLater { after } => after,
            other => panic!("not retried later: {other:?}"),
        };
        let held = decide(ClaimResult::Held {
            lease_left: Duration::from_millis(250),
        });
        assert_eq!(held.outcome, Outcome::InFlight);
        assert_eq!(after(held), Duration::from_millis(250));
        let locked = decide(ClaimResult::Locked);
        assert_eq!(locked.outcome, Outcome::InFlight);
        assert_eq!(after(locked), Duration::from_millis(500));
        let contended = decide(ClaimResult::Contended);
        assert_eq!(contended.identity, Some(parsed().identity));
        assert_eq!(after(contended), BACKOFF.min);
    }

    #[test]
    fn another_operation_under_the_key_is_dead_lettered_as_a_conflict() {
        let d = decide(ClaimResult::Conflict);
        assert_eq!(d.outcome, Outcome::Conflict);
        assert_eq!(d.fingerprint, Some(parsed().fingerprint));
        let Action::DeadLetter { reason, detail } = d.action else {
            panic!("not dead-lettered");
        };
        assert_eq!(reason, DeadLetterReason::Conflict);
        assert!(detail.contains("fingerprint differs"), "{detail}");
    }

    #[test]
    fn a_retry_past_the_transports_limit_is_dead_lettered_and_others_pass() {
        let mut msg = Incoming::new(Source::Direct { id: 1 }, "{}");
        msg.retry_limit = Some(3);
        msg.retries = 3;
        let d = limit_retries(&msg, retry_soon(BACKOFF, Outcome::InFlight));
        let Action::DeadLetter { reason, detail } = d.action else {
            panic!("not dead-lettered");
        };
        assert_eq!(reason, DeadLetterReason::RetryLimit);
        assert_eq!(detail, "still 'in_flight' after coming back 3 times");
        msg.retries = 2;
        let d = retry_soon(BACKOFF, Outcome::InFlight);
        assert_eq!(limit_retries(&msg, d.clone()), d);
        msg.retries = 3;
        let commit = decide(ClaimResult::HeldUnknown { attempts: 1 });
        assert_eq!(limit_retries(&msg, commit.clone()), commit);
    }
}

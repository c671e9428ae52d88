//! The verdict rules, one situation at a time.

use super::*;
use crate::handler::FaultReason;

fn opts() -> EngineOptions {
    EngineOptions {
        max_attempts: 3,
        retry_for: Duration::from_secs(60),
        backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
        ..EngineOptions::default()
    }
}

/// A first attempt on a new key, just claimed.
fn first() -> Facts {
    Facts {
        attempts: 1,
        uncertain: false,
        fresh: Outcome::Processed,
        active: Duration::ZERO,
        streak: Streak::default(),
    }
}

fn last() -> Facts {
    Facts {
        attempts: 3,
        ..first()
    }
}

fn call(facts: &Facts, outcome: HandlerOutcome) -> Verdict {
    judge(
        facts,
        Ran::Called {
            outcome,
            probe: false,
        },
        &opts(),
    )
}

fn transient(status: Option<i32>) -> HandlerOutcome {
    HandlerOutcome::Transient {
        status,
        error: "refused".into(),
        retry_after: None,
    }
}

fn unknown() -> HandlerOutcome {
    HandlerOutcome::Unknown {
        error: "timed out".into(),
    }
}

fn fault() -> HandlerOutcome {
    HandlerOutcome::Fault {
        status: Some(401),
        reason: FaultReason::Unauthorized,
        error: "401".into(),
    }
}

fn dead_letter(v: &Verdict) -> DeadLetterReason {
    match &v.action {
        Action::DeadLetter { reason, .. } => reason.clone(),
        other => panic!("not dead-lettered: {other:?}"),
    }
}

fn retried(v: &Verdict) -> bool {
    matches!(v.action, Action::RetryLater { .. })
}

#[test]
fn a_success_is_stored_done_and_replied_with() {
    let r = HandlerResult::json(201, &serde_json::json!({"charge": 1}));
    let v = call(&first(), HandlerOutcome::Success(r.clone()));
    assert_eq!(v.outcome, Outcome::Processed);
    assert!(matches!(v.finish, Finish::Done(Answer { status: 201, .. })));
    let reply = Some(stored(KeyStatus::Done, r.clone()));
    assert_eq!(v.action, Action::Commit { reply });
    let taken_over = Facts {
        fresh: Outcome::Takeover,
        ..first()
    };
    let v = call(&taken_over, HandlerOutcome::Success(r));
    assert_eq!(v.outcome, Outcome::Takeover);
}

#[test]
fn a_refusal_is_stored_failed() {
    let r = HandlerResult::json(402, &serde_json::json!({"declined": true}));
    let v = call(&first(), HandlerOutcome::Permanent(r));
    assert_eq!(v.outcome, Outcome::Failed);
    assert!(matches!(
        v.finish,
        Finish::Failed(Answer { status: 402, .. })
    ));
}

#[test]
fn a_transient_failure_releases_the_key_and_on_the_last_attempt_leaves_it_free() {
    let v = call(&first(), transient(Some(503)));
    assert_eq!(v.outcome, Outcome::Retried);
    assert!(retried(&v));
    let release = |refund| Finish::Release {
        error: "refused".into(),
        refund,
    };
    assert_eq!(v.finish, release(Refund::No));
    let v = call(&last(), transient(Some(503)));
    assert_eq!(dead_letter(&v), DeadLetterReason::ExhaustedRetries);
    assert_eq!(
        v.finish,
        release(Refund::No),
        "never failed: nothing was refused"
    );
}

#[test]
fn after_an_unknown_attempt_a_transient_failure_leaves_the_key_unknown() {
    let uncertain = Facts {
        uncertain: true,
        ..first()
    };
    let v = call(&uncertain, transient(Some(503)));
    assert_eq!(v.outcome, Outcome::Unknown);
    assert!(matches!(v.finish, Finish::Unknown { hold: false, .. }));
}

#[test]
fn an_unknown_outcome_is_retried_and_after_the_last_attempt_held() {
    let v = call(&first(), unknown());
    assert_eq!(v.outcome, Outcome::Unknown);
    assert!(retried(&v));
    let v = call(&last(), unknown());
    assert_eq!(dead_letter(&v), DeadLetterReason::OutcomeUnknown);
    assert!(matches!(v.finish, Finish::Unknown { hold: true, .. }));
    let out_of_time = Facts {
        active: Duration::from_secs(61),
        ..first()
    };
    let v = call(&out_of_time, unknown());
    assert_eq!(dead_letter(&v), DeadLetterReason::OutcomeUnknown);
}

#[test]
fn a_409_uses_no_attempt_until_the_provider_has_said_so_for_too_long() {
    assert!(uses_no_attempt(&transient(Some(409))));
    assert!(!uses_no_attempt(&transient(Some(503))));
    let still_running = Facts {
        uncertain: true,
        streak: Streak {
            count: 30,
            lasted: STILL_WORKING_FOR - Duration::from_secs(1),
        },
        ..last()
    };
    let v = call(&still_running, transient(Some(409)));
    assert_eq!(v.outcome, Outcome::Retried);
    assert!(retried(&v), "the last attempt is not used up by a 409");
    assert!(matches!(
        v.finish,
        Finish::Unknown {
            refund: Refund::Uncounted,
            ..
        }
    ));
    let stuck = Facts {
        streak: Streak {
            count: 31,
            lasted: STILL_WORKING_FOR,
        },
        ..still_running
    };
    let v = call(&stuck, transient(Some(409)));
    assert_eq!(dead_letter(&v), DeadLetterReason::OutcomeUnknown);
}

#[test]
fn a_fault_gives_the_attempt_back_until_retry_for_runs_out() {
    assert!(uses_no_attempt(&fault()));
    let v = call(&last(), fault());
    assert_eq!(v.outcome, Outcome::Fault);
    assert!(retried(&v), "a fault uses no attempt");
    assert!(matches!(
        v.finish,
        Finish::Release {
            refund: Refund::Uncounted,
            ..
        }
    ));
    let out_of_time = Facts {
        active: Duration::from_secs(60),
        ..first()
    };
    let v = call(&out_of_time, fault());
    assert_eq!(dead_letter(&v), DeadLetterReason::HandlerFault);
    assert!(matches!(
        v.finish,
        Finish::Release {
            refund: Refund::Uncounted,
            ..
        }
    ));
    let uncertain = Facts {
        uncertain: true,
        ..out_of_time
    };
    let v = call(&uncertain, fault());
    assert_eq!(v.outcome, Outcome::Unknown);
    assert_eq!(dead_letter(&v), DeadLetterReason::OutcomeUnknown);
    assert!(matches!(v.finish, Finish::Unknown { hold: true, .. }));
}

#[test]
fn a_failed_probe_uses_no_attempt_even_on_the_last_one() {
    let probe = Ran::Called {
        outcome: transient(None),
        probe: true,
    };
    let v = judge(&last(), probe, &opts());
    assert!(retried(&v));
    let uncounted = Finish::Release {
        error: "refused".into(),
        refund: Refund::Uncounted,
    };
    assert_eq!(v.finish, uncounted);
}

/// A probe's request went out and may have been charged: the next
/// request of the key must carry another attempt number, so the attempt
/// is not counted but keeps its number.
#[test]
fn a_probe_without_an_answer_keeps_its_attempt_number_and_leaves_the_key_unknown() {
    let probe = Ran::Called {
        outcome: unknown(),
        probe: true,
    };
    let v = judge(&last(), probe, &opts());
    assert!(
        retried(&v),
        "a failed probe does not use up the last attempt"
    );
    assert_eq!(
        v.finish,
        Finish::Unknown {
            error: "timed out".into(),
            hold: false,
            refund: Refund::Uncounted,
        }
    );
}

#[test]
fn a_call_that_never_started_gives_the_key_back() {
    let after = Duration::from_secs(5);
    let v = judge(&first(), Ran::Skipped(Skip::Paused(after)), &opts());
    assert_eq!(v.outcome, Outcome::Paused);
    assert_eq!(v.action, Action::Postpone { after });
    assert!(matches!(
        v.finish,
        Finish::Release {
            refund: Refund::Unsent,
            ..
        }
    ));
    let uncertain = Facts {
        uncertain: true,
        ..first()
    };
    let v = judge(&uncertain, Ran::Skipped(Skip::LeaseInDoubt), &opts());
    assert_eq!(v.outcome, Outcome::LeaseLost);
    assert!(matches!(
        v.finish,
        Finish::Unknown {
            refund: Refund::Unsent,
            ..
        }
    ));
}

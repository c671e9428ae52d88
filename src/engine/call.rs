//! One won claim's handler call: a concurrency permit, the lease checked
//! before it starts, the provider gate asked, the handler run within its
//! timeout and its lease; then the facts about it that the verdict rules
//! judge.

use super::batch::{Owned, Ran, Skip};
use super::inner::Inner;
use super::lease::LeaseKeeper;
use super::message::Incoming;
use super::provider_gate::{Admit, Signal};
use super::verdict::{self, Facts, Verdict};
use crate::handler::{HandlerCall, HandlerOutcome, Request};
use crate::health::Component;
use crate::telemetry::spans;
use chrono::{DateTime, Utc};
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Runs claim `j`'s handler with the request the key stored at its first
/// claim.
pub(super) async fn run_one(
    inner: &Inner,
    batch: &[Incoming],
    o: &Owned<'_>,
    lease_deadline: DateTime<Utc>,
    keeper: &LeaseKeeper<'_>,
    j: usize,
) -> (usize, Ran) {
    let call = handler_call(inner, &batch[o.pending.index], o, lease_deadline);
    #[cfg(feature = "broken")]
    if let Some(done) = &o.pending.early {
        let _ = (keeper, call);
        let outcome = done.clone();
        return (
            j,
            Ran::Called {
                outcome,
                probe: false,
            },
        );
    }
    let span = spans::handler(&o.pending.span, call.attempt, call.epoch);
    (j, call_handler(inner, &call, keeper, j, span).await)
}

fn handler_call<'a>(
    inner: &'a Inner,
    msg: &'a Incoming,
    o: &'a Owned<'_>,
    lease_deadline: DateTime<Utc>,
) -> HandlerCall<'a> {
    let parsed = &o.pending.parsed;
    let stored = o.claim.stored_request.as_ref();
    HandlerCall {
        identity: &parsed.identity,
        derived_key: stored.map_or(&parsed.derived_key, |r| &r.derived_key),
        request: Request {
            body: stored.map_or(&msg.body[..], |r| &r.body[..]),
            content_type: stored.map_or(msg.content_type.as_deref(), |r| r.content_type.as_deref()),
        },
        headers: &msg.headers,
        attempt: o.claim.attempts.max(1) as u32,
        epoch: o.claim.epoch,
        owner: &inner.options.owner,
        lease_deadline,
        source: &msg.source,
        uncertain: o.claim.uncertain,
    }
}

/// The handler call of claim `j`, once a concurrency permit is free, if
/// the lease can still be trusted and the provider is not paused.
async fn call_handler(
    inner: &Inner,
    call: &HandlerCall<'_>,
    keeper: &LeaseKeeper<'_>,
    j: usize,
    span: tracing::Span,
) -> Ran {
    // The semaphore is never closed, so acquiring cannot fail.
    let _permit = inner.permits.acquire().await;
    // A call queued behind others may find its lease gone by now (the
    // process was paused, the runtime stalled): it must not start on it.
    let checked = if crate::broken::is(crate::broken::Break::NoLeaseCheck) {
        Ok(())
    } else {
        keeper.check_before_call(j, &inner.store).await
    };
    if let Err(doubt) = checked {
        tracing::warn!(identity = %call.identity, epoch = call.epoch.0, %doubt,
            "not calling the handler: the lease may have ended; the key is given back");
        return Ran::Skipped(Skip::LeaseInDoubt);
    }
    let probe = match inner.gate.admit() {
        Admit::Go => false,
        Admit::Probe => true,
        Admit::Wait(after) => return Ran::Skipped(Skip::Paused(after)),
    };
    let started = Instant::now();
    let (outcome, signal) = bounded(inner, call, &span, keeper.lost_signal(j)).await;
    inner.gate.report(call.identity, signal, probe);
    inner
        .metrics
        .handler_duration
        .with_label_values(&[outcome.label()])
        .observe(started.elapsed().as_secs_f64());
    let answered = matches!(
        outcome,
        HandlerOutcome::Success(_) | HandlerOutcome::Permanent(_)
    );
    spans::handled(&span, outcome.label(), answered);
    Ran::Called { outcome, probe }
}

/// Runs the handler until it answers, panics, outlasts `handler.timeout`
/// or loses its lease; and what that says about the provider.
async fn bounded(
    inner: &Inner,
    call: &HandlerCall<'_>,
    span: &tracing::Span,
    lost: CancellationToken,
) -> (HandlerOutcome, Signal) {
    let timeout = inner.options.handler_timeout;
    let handle = inner.handler.handle(call).instrument(span.clone());
    let run = AssertUnwindSafe(handle).catch_unwind();
    tokio::select! {
        out = tokio::time::timeout(timeout, run) => match out {
            Ok(Ok(outcome)) => {
                let signal = Signal::of(&outcome);
                (outcome, signal)
            }
            Ok(Err(_panic)) => (
                HandlerOutcome::Unknown { error: "handler panicked".into() },
                Signal::Neutral,
            ),
            Err(_) => (
                HandlerOutcome::Unknown {
                    error: format!("handler timed out after {timeout:?}"),
                },
                Signal::Failing { retry_after: None },
            ),
        },
        _ = lost.cancelled() => (
            HandlerOutcome::Unknown {
                error: "lease could not be kept while the handler ran".into(),
            },
            Signal::Neutral,
        ),
    }
}

/// The verdict on claim `o`'s run: gathers the facts (the key's streak of
/// uncounted retries, the time not paused) and reports what the answer
/// says about the handler on /readyz and in the metrics.
pub(super) fn judge(inner: &Inner, o: &Owned<'_>, ran: Ran) -> Verdict {
    let claim = &o.claim;
    let streak = match &ran {
        Ran::Called { outcome, .. } => {
            let identity = &o.pending.parsed.identity;
            let streak = inner
                .streaks
                .next(identity, verdict::uses_no_attempt(outcome));
            report(inner, identity, outcome, streak.count);
            streak
        }
        Ran::Skipped(_) => Default::default(),
    };
    let facts = Facts {
        attempts: claim.counted.max(1) as u32,
        uncertain: claim.uncertain,
        fresh: o.fresh,
        // Time paused for a provider outage is not the payment's.
        active: claim
            .age
            .saturating_sub(inner.gate.paused_within(claim.age)),
        streak,
    };
    verdict::judge(&facts, ran, &inner.options)
}

/// An answer about the payment clears a fault (the gate reports an outage
/// of its own, until a probe is answered); a fault is counted, logged and
/// shown on /readyz.
fn report(inner: &Inner, identity: &crate::identity::Identity, out: &HandlerOutcome, streak: u32) {
    match out {
        HandlerOutcome::Success(_) | HandlerOutcome::Permanent(_)
            if inner.gate.paused().is_none() =>
        {
            inner.health.set(Component::Handler, true);
        }
        HandlerOutcome::Fault { reason, error, .. } => {
            inner
                .metrics
                .handler_faults
                .with_label_values(&[reason.label()])
                .inc();
            inner.health.set(Component::Handler, false);
            tracing::warn!(%identity, reason = reason.label(), %error, streak,
                "handler fault: the answer points at dedupq's configuration; nothing stored, retrying");
        }
        _ => {}
    }
}

/// Test-only: the naive order (work first, then record the key), so the
/// tests and the chaos run can show that they catch it.
#[cfg(feature = "broken")]
pub(super) async fn work_before_claiming(
    inner: &Inner,
    batch: &[Incoming],
    pending: &mut [super::batch::Pending],
) {
    let runs = pending.iter().map(|p| async {
        let msg = &batch[p.index];
        let call = HandlerCall {
            identity: &p.parsed.identity,
            derived_key: &p.parsed.derived_key,
            request: Request {
                body: &msg.body,
                content_type: msg.content_type.as_deref(),
            },
            headers: &msg.headers,
            attempt: 1,
            epoch: crate::identity::Epoch(0),
            owner: &inner.options.owner,
            lease_deadline: Utc::now() + inner.options.lease,
            source: &msg.source,
            uncertain: false,
        };
        inner.handler.handle(&call).await
    });
    let outcomes = futures::future::join_all(runs).await;
    for (p, outcome) in pending.iter_mut().zip(outcomes) {
        p.early = Some(outcome);
    }
}

//! Running the handlers of won claims, keeping their leases, and storing
//! their outcomes as they finish (one round trip per group of finishers).

use super::core::{retry_soon, Engine, Pending};
use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::lease::LeaseKeeper;
use super::message::Incoming;
use super::provider_gate::{Admit, Signal};
use super::verdict::Verdict;
use crate::handler::{HandlerCall, HandlerOutcome, Request};
use crate::store::{Answer, Claim, Finish, FinishWrite, StoreError, Written};
use crate::telemetry::spans;
use chrono::{DateTime, Utc};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

/// A key this worker owns: the message that claimed it and the claim.
pub(super) struct Owned<'a> {
    pub pending: &'a Pending,
    pub claim: Claim,
    /// `Processed` for a new key, `Takeover` for one taken over.
    pub fresh: Outcome,
}

impl<'a> Owned<'a> {
    pub fn new(pending: &'a Pending, claim: Claim, fresh: Outcome) -> Self {
        Self {
            pending,
            claim,
            fresh,
        }
    }
}

/// What became of a claim's handler call.
pub(super) enum Ran {
    /// It ran and says how it went; `probe`: it was the one call let
    /// through while intake was paused for a provider outage.
    Called {
        outcome: HandlerOutcome,
        probe: bool,
    },
    /// It never started; nothing reached the provider.
    Skipped(Skip),
}

/// Why a handler call never started.
pub(super) enum Skip {
    /// Intake is paused for a provider outage: try again after this long.
    Paused(Duration),
    /// The lease may have ended (the process was paused, the runtime
    /// stalled) and PostgreSQL could not confirm it.
    LeaseInDoubt,
}

/// Whether a finish write landed.
enum Stored {
    Landed,
    /// The epoch no longer matches: another worker owns the key.
    Fenced,
    /// Another transaction holds the row: the finish is written later, in
    /// the background, while the lease is kept (see `Engine::park`).
    Locked(Finish),
    /// PostgreSQL refused the row itself (not an outage).
    Rejected(String),
}

impl Engine {
    pub(super) async fn run_claimed(
        &self,
        batch: &[Incoming],
        owned: Vec<Owned<'_>>,
        claimed_at: Instant,
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        let opts = &self.inner.options;
        let lease_deadline = Utc::now() + opts.lease;
        let keeper = LeaseKeeper::new(
            owned
                .iter()
                .map(|o| (&o.pending.parsed.identity, o.claim.epoch))
                .collect(),
            claimed_at,
            opts.lease,
            opts.renew_every,
        );
        let mut running: FuturesUnordered<_> = owned
            .iter()
            .enumerate()
            .map(|(j, o)| self.run_one(batch, o, lease_deadline, &keeper, j))
            .collect();
        let renewal = keeper.run(
            &self.inner.store,
            &self.inner.metrics,
            opts.renew_every,
            opts.lease,
        );
        tokio::pin!(renewal);
        while !running.is_empty() {
            let ready = next_finished(&mut running, &mut renewal).await;
            let verdicts: Vec<(usize, Verdict)> = ready
                .into_iter()
                .map(|(j, out)| (j, self.judge(&owned[j], out)))
                .collect();
            for (j, _) in &verdicts {
                keeper.answered(*j);
            }
            let stored = self
                .keep_renewing(&mut renewal, self.store_verdicts(&owned, &verdicts))
                .await?;
            for ((j, verdict), stored) in verdicts.into_iter().zip(stored) {
                keeper.forget(j);
                let o = &owned[j];
                decisions[o.pending.index] = Some(self.after_store(o, verdict.decision, stored));
            }
        }
        Ok(())
    }

    /// One handler run, with the request the key stored at its first claim.
    async fn run_one(
        &self,
        batch: &[Incoming],
        o: &Owned<'_>,
        lease_deadline: DateTime<Utc>,
        keeper: &LeaseKeeper<'_>,
        j: usize,
    ) -> (usize, Ran) {
        {
            let msg = &batch[o.pending.index];
            let stored = o.claim.stored_request.as_ref();
            let call = HandlerCall {
                identity: &o.pending.parsed.identity,
                derived_key: stored.map_or(&o.pending.parsed.derived_key, |r| &r.derived_key),
                request: Request {
                    body: stored.map_or(&msg.body[..], |r| &r.body[..]),
                    content_type: stored
                        .map_or(msg.content_type.as_deref(), |r| r.content_type.as_deref()),
                },
                headers: &msg.headers,
                attempt: o.claim.attempts.max(1) as u32,
                epoch: o.claim.epoch,
                owner: &self.inner.options.owner,
                lease_deadline,
                source: &msg.source,
                uncertain: o.claim.uncertain,
            };
            #[cfg(feature = "broken-claim-after-work")]
            if let Some(done) = &o.pending.early {
                let _ = (keeper, call);
                return (
                    j,
                    Ran::Called {
                        outcome: done.clone(),
                        probe: false,
                    },
                );
            }
            let span = spans::handler(&o.pending.span, call.attempt, call.epoch);
            (j, self.call_handler(&call, keeper, j, span).await)
        }
    }

    /// Awaits `work` while the lease keeper keeps renewing the claims that
    /// are still running.
    async fn keep_renewing<T>(
        &self,
        renewal: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
        work: impl Future<Output = T>,
    ) -> T {
        tokio::pin!(work);
        loop {
            tokio::select! {
                r = &mut work => return r,
                _ = renewal.as_mut() => {}
            }
        }
    }

    /// Stores the verdicts in one statement, waiting out an outage. If
    /// PostgreSQL refuses the statement itself, each row is written on its
    /// own, so one bad row never holds back (or re-runs) its batch-mates.
    async fn store_verdicts(
        &self,
        owned: &[Owned<'_>],
        verdicts: &[(usize, Verdict)],
    ) -> Result<Vec<Stored>, StoreError> {
        let writes: Vec<FinishWrite> = verdicts
            .iter()
            .map(|(j, v)| FinishWrite {
                identity: &owned[*j].pending.parsed.identity,
                epoch: owned[*j].claim.epoch,
                finish: v.finish.clone(),
            })
            .collect();
        let timer = self
            .inner
            .metrics
            .store_duration
            .with_label_values(&["finish"])
            .start_timer();
        let whole = self
            .store_retry(|| self.inner.store.finish_batch(&writes))
            .instrument(spans::finish(writes.len()))
            .await;
        timer.observe_duration();
        match whole {
            Ok(written) => Ok(written
                .into_iter()
                .zip(&writes)
                .map(|(w, write)| stored(w, &write.finish))
                .collect()),
            Err(e) if e.is_transient() => Err(e),
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::chain(&e), rows = writes.len(),
                    "PostgreSQL refused a finish statement; writing its rows one by one");
                let mut out = Vec::with_capacity(writes.len());
                for write in &writes {
                    out.push(self.store_alone(write).await?);
                }
                Ok(out)
            }
        }
    }

    /// One row on its own; if refused, once more without the answer's body
    /// (the status is what matters about money), then give up on the row.
    async fn store_alone(&self, write: &FinishWrite<'_>) -> Result<Stored, StoreError> {
        let attempt = |finish: Finish| {
            let one = [FinishWrite {
                identity: write.identity,
                epoch: write.epoch,
                finish,
            }];
            async move {
                self.store_retry(|| self.inner.store.finish_batch(&one))
                    .await
            }
        };
        let refused = match attempt(write.finish.clone()).await {
            Ok(written) => return Ok(stored(written[0], &write.finish)),
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => crate::telemetry::chain(&e).to_string(),
        };
        let bare = |a: &Answer| Answer {
            status: a.status,
            body: Vec::new(),
            content_type: None,
        };
        let without_body = match &write.finish {
            Finish::Done(a) => Finish::Done(bare(a)),
            Finish::Failed(a) => Finish::Failed(bare(a)),
            _ => return Ok(Stored::Rejected(refused)),
        };
        tracing::warn!(identity = %write.identity, error = %refused,
            "PostgreSQL refused the answer's body; storing the outcome without it");
        match attempt(without_body.clone()).await {
            Ok(written) => Ok(stored(written[0], &without_body)),
            Err(e) if e.is_transient() => Err(e),
            Err(e) => Ok(Stored::Rejected(crate::telemetry::chain(&e).to_string())),
        }
    }

    fn after_store(&self, o: &Owned<'_>, decision: Decision, stored: Stored) -> Decision {
        let identity = &o.pending.parsed.identity;
        spans::stored(&o.pending.span, stored.label());
        match stored {
            Stored::Landed => decision,
            Stored::Fenced => {
                self.inner.metrics.fenced_writes.inc();
                tracing::warn!(%identity, epoch = o.claim.epoch.0, "write fenced: lease lost");
                Decision {
                    identity: Some(identity.clone()),
                    epoch: Some(o.claim.epoch),
                    ..retry_soon(&self.inner.options, Outcome::LeaseLost)
                }
            }
            // The answer is kept and written as soon as the row is free;
            // the message waits (uncommitted) and finds it stored.
            Stored::Locked(finish) => {
                tracing::warn!(%identity, epoch = o.claim.epoch.0,
                    "another transaction holds the key's row; its outcome is stored once it lets go");
                self.park(identity.clone(), o.claim.epoch, finish);
                Decision {
                    identity: Some(identity.clone()),
                    epoch: Some(o.claim.epoch),
                    ..retry_soon(&self.inner.options, Outcome::InFlight)
                }
            }
            // The key stays open with its attempt marked unfinished: the
            // next attempt treats the outcome as uncertain.
            Stored::Rejected(error) => Decision {
                action: Action::DeadLetter {
                    reason: DeadLetterReason::StoreRejected,
                    detail: format!("the outcome could not be stored: {error}"),
                },
                ..decision
            },
        }
    }

    /// The handler call of claim `j`, once a concurrency permit is free,
    /// if the lease can still be trusted and the provider is not paused.
    async fn call_handler(
        &self,
        call: &HandlerCall<'_>,
        keeper: &LeaseKeeper<'_>,
        j: usize,
        span: tracing::Span,
    ) -> Ran {
        let inner = &self.inner;
        // The semaphore is never closed, so acquiring cannot fail.
        let _permit = inner.permits.acquire().await;
        // A call queued behind others may find its lease gone by now (the
        // process was paused, the runtime stalled): it must not start on it.
        if let Err(doubt) = keeper.check_before_call(j, &inner.store).await {
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
        let handle = inner.handler.handle(call).instrument(span.clone());
        let run = AssertUnwindSafe(handle).catch_unwind();
        let lost = keeper.lost_signal(j);
        let (outcome, signal) = tokio::select! {
            out = tokio::time::timeout(inner.options.handler_timeout, run) => match out {
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
                        error: format!("handler timed out after {:?}", inner.options.handler_timeout),
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
        };
        inner.gate.report(call.identity, signal, probe);
        let label = outcome.label();
        inner
            .metrics
            .handler_duration
            .with_label_values(&[label])
            .observe(started.elapsed().as_secs_f64());
        let answered = matches!(
            outcome,
            HandlerOutcome::Success(_) | HandlerOutcome::Permanent(_)
        );
        spans::handled(&span, label, answered);
        Ran::Called { outcome, probe }
    }
}

impl Stored {
    fn label(&self) -> &'static str {
        match self {
            Stored::Landed => "landed",
            Stored::Fenced => "fenced",
            Stored::Locked(_) => "locked",
            Stored::Rejected(_) => "rejected",
        }
    }
}

fn stored(written: Written, finish: &Finish) -> Stored {
    match written {
        Written::Landed => Stored::Landed,
        Written::Fenced => Stored::Fenced,
        Written::Locked => Stored::Locked(finish.clone()),
    }
}

/// How long handlers that finished wait for the next one before their
/// outcomes are stored. Handlers that finish together (a fast provider, or
/// handlers let through the concurrency limit one wave after another, as
/// permits come back from other batches) are stored in one statement, and
/// a slow handler never holds back the ones that finished before it for
/// longer than this.
const GATHER: Duration = Duration::from_millis(1);

/// The next handler to finish, plus every other that finishes with it or
/// within `GATHER` of the one before, so they are stored together. The
/// lease keeper keeps renewing meanwhile.
async fn next_finished<F: Future<Output = (usize, Ran)>>(
    running: &mut FuturesUnordered<F>,
    renewal: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Vec<(usize, Ran)> {
    let first = loop {
        tokio::select! {
            Some(done) = running.next() => break done,
            _ = renewal.as_mut() => {}
        }
    };
    let mut ready = vec![first];
    loop {
        while let Some(Some(done)) = running.next().now_or_never() {
            ready.push(done);
        }
        if running.is_empty() {
            break;
        }
        let next = tokio::select! {
            next = tokio::time::timeout(GATHER, running.next()) => next,
            _ = renewal.as_mut() => continue,
        };
        match next {
            Ok(Some(done)) => ready.push(done),
            _ => break,
        }
    }
    ready
}

//! Running the handlers of won claims, keeping their leases, and storing
//! their outcomes as they finish (one round trip per group of finishers).

use super::core::{retry_soon, Engine, Pending};
use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::lease::LeaseKeeper;
use super::message::Incoming;
use crate::handler::{HandlerCall, HandlerOutcome};
use crate::identity::{Epoch, Identity};
use crate::store::{Finish, FinishWrite, KeyStatus, StoreError, StoredResult};
use chrono::{DateTime, Utc};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use serde_json::json;
use std::panic::AssertUnwindSafe;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(super) type Won<'a> = (&'a Pending, Epoch, i32, Outcome);

impl Engine {
    pub(super) async fn run_claimed(
        &self,
        batch: &[Incoming],
        won: Vec<Won<'_>>,
        claimed_at: Instant,
        lease_deadline: DateTime<Utc>,
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        let opts = &self.inner.options;
        let keeper = LeaseKeeper::new(
            won.iter()
                .map(|(p, epoch, ..)| (&p.parsed.identity, *epoch))
                .collect(),
            claimed_at,
            opts.lease,
        );
        let mut running: FuturesUnordered<_> = won
            .iter()
            .enumerate()
            .map(|(j, (p, epoch, attempts, _))| {
                let lost = keeper.lost_signal(j);
                let msg = &batch[p.index];
                async move {
                    let call = HandlerCall {
                        identity: &p.parsed.identity,
                        derived_key: &p.parsed.identity.derived_key(),
                        body: &p.parsed.body,
                        attempt: *attempts as u32,
                        epoch: *epoch,
                        owner: &self.inner.options.owner,
                        lease_deadline,
                        source: &msg.source,
                    };
                    #[cfg(feature = "broken-claim-after-work")]
                    if let Some(done) = &p.early {
                        let _ = lost;
                        return (j, done.clone());
                    }
                    (j, self.call_handler(&call, lost).await)
                }
            })
            .collect();
        let renewal = keeper.run(
            &self.inner.store,
            &self.inner.metrics,
            opts.renew_every,
            opts.lease,
        );
        tokio::pin!(renewal);

        while !running.is_empty() {
            let first = tokio::select! {
                Some(done) = running.next() => done,
                _ = &mut renewal => continue,
            };
            let mut ready = vec![first];
            // Store together whatever finished together. Tokio's and the
            // set's own fairness budgets end a drain early, so drain again
            // after one yield; stop as soon as nothing more is ready.
            loop {
                while let Some(Some(done)) = running.next().now_or_never() {
                    ready.push(done);
                }
                if running.is_empty() {
                    break;
                }
                tokio::task::yield_now().await;
                match running.next().now_or_never() {
                    Some(Some(done)) => ready.push(done),
                    _ => break,
                }
            }
            let writes: Vec<FinishWrite> = ready
                .iter()
                .map(|(j, out)| {
                    let (p, epoch, attempts, _) = &won[*j];
                    FinishWrite {
                        identity: &p.parsed.identity,
                        epoch: *epoch,
                        finish: self.finish_for(out, *attempts as u32),
                    }
                })
                .collect();
            let landed = {
                let store_write = self.store_retry(|| self.inner.store.finish_batch(&writes));
                tokio::pin!(store_write);
                // Keep renewing the others while this write waits out an outage.
                loop {
                    tokio::select! {
                        r = &mut store_write => break r?,
                        _ = &mut renewal => {}
                    }
                }
            };
            for ((j, out), landed) in ready.into_iter().zip(landed) {
                keeper.forget(j);
                let (p, epoch, attempts, fresh) = &won[j];
                let mut d = if landed {
                    self.decide(out, *fresh, *attempts as u32)
                } else {
                    self.inner.metrics.fenced_writes.inc();
                    tracing::warn!(identity = %p.parsed.identity, epoch = epoch.0, "write fenced: lease lost");
                    retry_soon(opts, None, Outcome::LeaseLost)
                };
                d.identity = Some(p.parsed.identity.clone());
                d.fingerprint = Some(p.parsed.fingerprint.clone());
                d.epoch = Some(*epoch);
                decisions[p.index] = Some(d);
            }
        }
        Ok(())
    }

    async fn call_handler(
        &self,
        call: &HandlerCall<'_>,
        lost: CancellationToken,
    ) -> HandlerOutcome {
        let inner = &self.inner;
        // The semaphore is never closed, so acquiring cannot fail.
        let _permit = inner.permits.acquire().await;
        let started = Instant::now();
        let run = AssertUnwindSafe(inner.handler.handle(call)).catch_unwind();
        let outcome = tokio::select! {
            out = tokio::time::timeout(inner.options.handler_timeout, run) => match out {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(_panic)) => HandlerOutcome::Unknown { error: "handler panicked".into() },
                Err(_) => HandlerOutcome::Unknown {
                    error: format!("handler timed out after {:?}", inner.options.handler_timeout),
                },
            },
            _ = lost.cancelled() => HandlerOutcome::Unknown {
                error: "lease could not be kept while the handler ran".into(),
            },
        };
        let label = match &outcome {
            HandlerOutcome::Success(_) => "success",
            HandlerOutcome::Permanent(_) => "permanent",
            HandlerOutcome::Transient { .. } => "transient",
            HandlerOutcome::Unknown { .. } => "unknown",
        };
        inner
            .metrics
            .handler_duration
            .with_label_values(&[label])
            .observe(started.elapsed().as_secs_f64());
        outcome
    }

    fn finish_for(&self, out: &HandlerOutcome, attempts: u32) -> Finish {
        let last = attempts >= self.inner.options.max_attempts;
        match out {
            HandlerOutcome::Success(r) => Finish::Done {
                status: r.status,
                body: r.body.clone(),
            },
            HandlerOutcome::Permanent(r) => Finish::Failed {
                status: r.status,
                body: r.body.clone(),
            },
            HandlerOutcome::Transient { status, error } if last => Finish::Failed {
                status: status.unwrap_or(0),
                body: json!({ "error": error, "attempts": attempts, "reason": "exhausted_retries" }),
            },
            HandlerOutcome::Transient { error, .. } => Finish::Release {
                error: error.clone(),
            },
            HandlerOutcome::Unknown { error } => Finish::Unknown {
                error: error.clone(),
            },
        }
    }

    fn decide(&self, out: HandlerOutcome, fresh: Outcome, attempts: u32) -> Decision {
        let opts = &self.inner.options;
        let last = attempts >= opts.max_attempts;
        let retry = Action::RetryLater {
            after: opts.backoff.after_attempt(attempts),
        };
        let (outcome, action) = match out {
            HandlerOutcome::Success(r) => (fresh, commit_with(KeyStatus::Done, r.status, r.body)),
            HandlerOutcome::Permanent(r) => (
                Outcome::Failed,
                commit_with(KeyStatus::Failed, r.status, r.body),
            ),
            HandlerOutcome::Transient { error, .. } if last => (
                Outcome::Failed,
                Action::DeadLetter {
                    reason: DeadLetterReason::ExhaustedRetries,
                    detail: format!("{attempts} attempts failed; last error: {error}"),
                },
            ),
            HandlerOutcome::Transient { .. } => (Outcome::Retried, retry),
            HandlerOutcome::Unknown { error } if last => (
                Outcome::Unknown,
                Action::DeadLetter {
                    reason: DeadLetterReason::OutcomeUnknown,
                    detail: format!("outcome unknown after {attempts} attempts: {error}"),
                },
            ),
            HandlerOutcome::Unknown { .. } => (Outcome::Unknown, retry),
        };
        Decision {
            outcome,
            action,
            identity: None::<Identity>,
            fingerprint: None,
            epoch: None,
        }
    }
}

fn commit_with(status: KeyStatus, result_status: i32, body: serde_json::Value) -> Action {
    Action::Commit {
        reply: Some(StoredResult {
            status,
            result_status,
            body,
        }),
    }
}

//! One round of a batch: claim the keys (one statement), decide what the
//! claim already settles, and run the handlers of the keys this worker won.

use super::claimed::Owned;
use super::core::{retry_soon, Engine, Pending};
use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::message::Incoming;
use crate::store::{ClaimRequest, ClaimResult, StoreError, StoredResult};
use tracing::Instrument;

/// A claim's result, or the dead letter of a message PostgreSQL refused.
type Claimed = Result<ClaimResult, Box<Decision>>;

/// How often a claim that raced a concurrent claimer is retried at once.
const CONTENDED_RETRIES: usize = 3;

impl Engine {
    pub(super) async fn run_round(
        &self,
        batch: &[Incoming],
        round: &[Pending],
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        let claimed_at = tokio::time::Instant::now();
        let results = self.claim_with_retries(batch, round).await?;
        let mut owned = Vec::new();
        for (p, result) in round.iter().zip(results) {
            if let Ok(r) = &result {
                crate::telemetry::spans::claimed(&p.span, r.label());
            }
            match result {
                Ok(ClaimResult::Won(claim)) => owned.push(Owned::new(p, claim, Outcome::Processed)),
                Ok(ClaimResult::TakenOver(claim)) => {
                    self.inner.metrics.takeovers.inc();
                    owned.push(Owned::new(p, claim, Outcome::Takeover));
                }
                Ok(settled) => decisions[p.index] = Some(self.settled_by_claim(p, settled)),
                Err(rejected) => decisions[p.index] = Some(*rejected),
            }
        }
        if !owned.is_empty() {
            self.run_claimed(batch, owned, claimed_at, decisions)
                .await?;
        }
        Ok(())
    }

    /// The decision for a claim that did not make this worker the owner.
    fn settled_by_claim(&self, p: &Pending, result: ClaimResult) -> Decision {
        let opts = &self.inner.options;
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
                    after: opts.backoff.for_held(lease_left),
                },
            ),
            // Another transaction holds the row: only this key waits.
            ClaimResult::Locked => (
                Outcome::InFlight,
                Action::RetryLater {
                    after: opts.backoff.for_held(opts.backoff.max),
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
                    identity: Some(p.parsed.identity.clone()),
                    ..retry_soon(opts, Outcome::InFlight)
                }
            }
        };
        Decision::about(outcome, action, &p.parsed)
    }

    /// Claims the round; requests that raced a concurrent claimer's insert
    /// are claimed again (a few times) to learn the row's real state. A
    /// statement PostgreSQL refuses (not an outage) is retried one message
    /// at a time, so only the message it cannot take is dead-lettered.
    async fn claim_with_retries(
        &self,
        batch: &[Incoming],
        round: &[Pending],
    ) -> Result<Vec<Claimed>, StoreError> {
        // A key whose answer this process still has to store (its row was
        // held) is not claimed meanwhile: a takeover would call again.
        let mut results: Vec<Claimed> = round
            .iter()
            .map(|p| {
                Ok(if self.is_parked(&p.parsed.identity) {
                    ClaimResult::Locked
                } else {
                    ClaimResult::Contended
                })
            })
            .collect();
        let mut todo: Vec<usize> = (0..round.len())
            .filter(|&i| {
                results[i]
                    .as_ref()
                    .is_ok_and(|r| *r == ClaimResult::Contended)
            })
            .collect();
        let parked = (round.len() - todo.len()) as u64;
        if parked > 0 {
            self.inner
                .metrics
                .claims
                .with_label_values(&[ClaimResult::Locked.label()])
                .inc_by(parked);
        }
        for _ in 0..CONTENDED_RETRIES {
            if todo.is_empty() {
                break;
            }
            let got = match self.claim(batch, round, &todo).await {
                Ok(got) => got.into_iter().map(Ok).collect(),
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => self.claim_one_by_one(batch, round, &todo, &e).await?,
            };
            let mut again = Vec::new();
            for (&i, r) in todo.iter().zip(got) {
                if let Ok(r) = &r {
                    self.inner
                        .metrics
                        .claims
                        .with_label_values(&[r.label()])
                        .inc();
                    if *r == ClaimResult::Contended {
                        again.push(i);
                    }
                }
                results[i] = r;
            }
            if again.is_empty() {
                break;
            }
            todo = again;
        }
        Ok(results)
    }

    async fn claim(
        &self,
        batch: &[Incoming],
        round: &[Pending],
        todo: &[usize],
    ) -> Result<Vec<ClaimResult>, StoreError> {
        let inner = &self.inner;
        let requests: Vec<ClaimRequest> = todo
            .iter()
            .map(|&i| {
                let p = &round[i];
                let msg = &batch[p.index];
                ClaimRequest {
                    identity: &p.parsed.identity,
                    fingerprint: &p.parsed.fingerprint,
                    body: &msg.body,
                    content_type: msg.content_type.as_deref(),
                    derived_key: &p.parsed.derived_key,
                }
            })
            .collect();
        inner
            .metrics
            .claim_batch_size
            .observe(requests.len() as f64);
        let timer = inner
            .metrics
            .store_duration
            .with_label_values(&["claim"])
            .start_timer();
        let got = inner
            .store
            .claim_batch(&requests, &inner.options.owner, inner.options.lease)
            .instrument(crate::telemetry::spans::claim(requests.len()))
            .await
            .inspect_err(|e| self.store_failed(e))?;
        timer.observe_duration();
        self.store_worked();
        Ok(got)
    }

    async fn claim_one_by_one(
        &self,
        batch: &[Incoming],
        round: &[Pending],
        todo: &[usize],
        refused: &StoreError,
    ) -> Result<Vec<Claimed>, StoreError> {
        tracing::warn!(error = %crate::telemetry::chain(refused), messages = todo.len(),
            "PostgreSQL refused a claim statement; claiming its messages one by one");
        let mut out = Vec::with_capacity(todo.len());
        for &i in todo {
            match self.claim(batch, round, &[i]).await {
                Ok(mut one) => out.push(Ok(one.pop().unwrap_or(ClaimResult::Contended))),
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => out.push(Err(Box::new(Decision::about(
                    Outcome::Invalid,
                    Action::DeadLetter {
                        reason: DeadLetterReason::StoreRejected,
                        detail: crate::telemetry::chain(&e).to_string(),
                    },
                    &round[i].parsed,
                )))),
            }
        }
        Ok(out)
    }
}

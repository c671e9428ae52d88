//! The leased engine, top-down: [`Engine::process`] parses a batch, claims
//! its keys in rounds, settles what the claims decide on their own, runs
//! the handlers of the keys this worker won while their leases are
//! renewed, stores the outcomes fenced by epoch and records one decision
//! per message. No broker types here; transports apply the decisions.

use super::batch::{split_first_occurrences, Owned, Pending};
use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::finish::{self, Stored};
use super::inner::Inner;
use super::lease::LeaseKeeper;
use super::message::{Incoming, InvalidReason, Parsed, Parser};
use super::options::EngineOptions;
use super::pipeline::{Pipeline, Unavailable};
use super::record::record;
use super::settle::{limit_retries, retry_soon, settled};
use super::verdict::Verdict;
use super::{call, claim};
use crate::backoff::Backoff;
use crate::handler::Handler;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::store::{ClaimResult, Store, StoreError};
use crate::telemetry::spans::{self, BatchTrace};
use async_trait::async_trait;
use chrono::Utc;
use futures::stream::FuturesUnordered;
use std::sync::Arc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The leased engine: claims a batch's keys in PostgreSQL, runs the
/// handlers of the keys it won while renewing their leases, stores their
/// outcomes fenced by epoch, and returns one [`Decision`] per message.
/// Clones share one engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// An engine whose handler faults go to a readiness state of its own,
    /// which no endpoint reads; [`Engine::with_health`] reports them on
    /// /readyz.
    pub fn new(
        store: Store,
        handler: Arc<dyn Handler>,
        parser: Parser,
        options: EngineOptions,
        metrics: Metrics,
        shutdown: CancellationToken,
    ) -> Self {
        let health = Health::default();
        Self::with_health(store, handler, parser, options, metrics, health, shutdown)
    }

    /// The same, reporting handler faults on `health` (for /readyz).
    pub fn with_health(
        store: Store,
        handler: Arc<dyn Handler>,
        parser: Parser,
        options: EngineOptions,
        metrics: Metrics,
        health: Health,
        shutdown: CancellationToken,
    ) -> Self {
        let inner = Inner::new(store, handler, parser, options, metrics, health, shutdown);
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The key table this engine claims in.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The metrics this engine records its decisions in.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The identity rules messages are read with.
    pub fn parser(&self) -> &Parser {
        &self.inner.parser
    }

    /// The leases, limits and backoff this engine runs with.
    pub fn options(&self) -> &EngineOptions {
        &self.inner.options
    }

    /// Decides every message of the batch: claims in one round trip per
    /// round, runs the won claims' handlers, stores their outcomes. Returns
    /// one decision per message, in order. An error means nothing of the
    /// batch may be committed (PostgreSQL is out of reach, or intake is
    /// paused for a provider outage); deliver it again later.
    pub async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, Unavailable> {
        let parsed = batch
            .iter()
            .map(|msg| self.inner.parser.parse(msg))
            .collect();
        self.process_read(batch, parsed).await
    }

    /// [`Engine::process`] for messages already read by this engine's
    /// parser (`parsed[i]` of `batch[i]`): nothing is parsed again.
    pub async fn process_parsed(
        &self,
        batch: &[Incoming],
        parsed: Vec<Parsed>,
    ) -> Result<Vec<Decision>, Unavailable> {
        self.process_read(batch, parsed.into_iter().map(Ok).collect())
            .await
    }

    async fn process_read(
        &self,
        batch: &[Incoming],
        parsed: Vec<Result<Parsed, InvalidReason>>,
    ) -> Result<Vec<Decision>, Unavailable> {
        let trace = BatchTrace::open(batch);
        let span = trace.span().clone();
        self.process_traced(batch, parsed, &trace)
            .instrument(span)
            .await
    }

    async fn process_traced(
        &self,
        batch: &[Incoming],
        parsed: Vec<Result<Parsed, InvalidReason>>,
        trace: &BatchTrace,
    ) -> Result<Vec<Decision>, Unavailable> {
        let inner = &*self.inner;
        let mut decisions: Vec<Option<Decision>> = vec![None; batch.len()];
        let mut pending = Vec::new();
        for (index, read) in parsed.into_iter().enumerate() {
            match read {
                Ok(parsed) => {
                    pending.push(Pending::new(index, parsed, trace.message(index).clone()))
                }
                Err(reason) => decisions[index] = Some(Decision::invalid(reason)),
            }
        }
        #[cfg(feature = "broken")]
        if crate::broken::is(crate::broken::Break::ClaimAfterWork) {
            call::work_before_claiming(inner, batch, &mut pending).await;
        }
        if inner.gate.paused().is_some() {
            pending = self.probe(batch, pending, &mut decisions).await?;
        }
        // Repeats of a key wait for a later round, where they find the
        // first one's result.
        while !pending.is_empty() {
            let (round, later) = split_first_occurrences(pending);
            for chunk in round.chunks(inner.options.max_batch) {
                self.run_round(batch, chunk, &mut decisions).await?;
            }
            pending = later;
        }
        let backoff = inner.options.backoff;
        let decisions: Vec<Decision> = batch
            .iter()
            .zip(decisions)
            .map(|(msg, d)| {
                let d = d.unwrap_or_else(|| retry_soon(backoff, Outcome::InFlight));
                limit_retries(msg, d)
            })
            .collect();
        record(&inner.metrics, trace, batch, &decisions);
        Ok(decisions)
    }

    /// While the provider is in an outage nothing is claimed, except one
    /// message at a time when a probe may start, until one of them calls
    /// the provider. Returns the messages left for the usual rounds once
    /// the provider answers; an error while it does not.
    async fn probe(
        &self,
        batch: &[Incoming],
        pending: Vec<Pending>,
        decisions: &mut [Option<Decision>],
    ) -> Result<Vec<Pending>, Unavailable> {
        let mut left = pending.into_iter();
        loop {
            match self.inner.gate.paused() {
                None => return Ok(left.collect()),
                Some(wait) if !wait.is_zero() => {
                    return Err(Unavailable::Provider { retry_after: wait })
                }
                Some(_) => {}
            }
            let Some(next) = left.next() else {
                return Ok(Vec::new());
            };
            self.run_round(batch, std::slice::from_ref(&next), decisions)
                .await?;
        }
    }

    /// One round: claims its keys (one statement), decides what the claims
    /// settle, and runs the handlers of the keys this worker won.
    async fn run_round(
        &self,
        batch: &[Incoming],
        round: &[Pending],
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let claimed_at = Instant::now();
        let results = claim::claim_round(inner, batch, round).await?;
        let mut owned = Vec::new();
        for (p, result) in round.iter().zip(results) {
            if let Ok(r) = &result {
                spans::claimed(&p.span, r.label());
            }
            match result {
                Ok(ClaimResult::Won(claim)) => owned.push(Owned::new(p, claim, Outcome::Processed)),
                Ok(ClaimResult::TakenOver(claim)) => {
                    inner.metrics.takeovers.inc();
                    owned.push(Owned::new(p, claim, Outcome::Takeover));
                }
                Ok(other) => {
                    decisions[p.index] = Some(settled(other, &p.parsed, inner.options.backoff))
                }
                Err(rejected) => decisions[p.index] = Some(*rejected),
            }
        }
        if !owned.is_empty() {
            self.run_claimed(batch, owned, claimed_at, decisions)
                .await?;
        }
        Ok(())
    }

    /// Runs the handlers of the won claims while their leases are renewed,
    /// and stores their outcomes as they finish (one statement per group
    /// of finishers).
    async fn run_claimed(
        &self,
        batch: &[Incoming],
        owned: Vec<Owned<'_>>,
        claimed_at: Instant,
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let opts = &inner.options;
        let lease_deadline = Utc::now() + opts.lease;
        let claims = owned
            .iter()
            .map(|o| (&o.pending.parsed.identity, o.claim.epoch))
            .collect();
        let keeper = LeaseKeeper::new(claims, claimed_at, opts.lease, opts.renew_every);
        let mut running: FuturesUnordered<_> = owned
            .iter()
            .enumerate()
            .map(|(j, o)| call::run_one(inner, batch, o, lease_deadline, &keeper, j))
            .collect();
        let renewal = keeper.run(&inner.store, &inner.metrics, opts.renew_every, opts.lease);
        tokio::pin!(renewal);
        while !running.is_empty() {
            let ready = finish::next_finished(&mut running, &mut renewal).await;
            let verdicts: Vec<(usize, Verdict)> = ready
                .into_iter()
                .map(|(j, ran)| (j, call::judge(inner, &owned[j], ran)))
                .collect();
            for (j, _) in &verdicts {
                keeper.answered(*j);
            }
            let storing = finish::store_verdicts(inner, &owned, &verdicts);
            let stored = finish::keep_renewing(&mut renewal, storing).await?;
            for ((j, verdict), stored) in verdicts.into_iter().zip(stored) {
                keeper.forget(j);
                let o = &owned[j];
                decisions[o.pending.index] = Some(self.after_store(o, verdict, stored));
            }
        }
        Ok(())
    }

    /// The decision about a won claim once its outcome's write came back.
    fn after_store(&self, o: &Owned<'_>, verdict: Verdict, stored: Stored) -> Decision {
        let identity = &o.pending.parsed.identity;
        let epoch = o.claim.epoch;
        spans::stored(&o.pending.span, stored.label());
        let decision = Decision {
            epoch: Some(epoch),
            ..Decision::about(verdict.outcome, verdict.action, &o.pending.parsed)
        };
        let wait = |outcome| Decision {
            identity: Some(identity.clone()),
            epoch: Some(epoch),
            ..retry_soon(self.inner.options.backoff, outcome)
        };
        match stored {
            Stored::Landed => decision,
            Stored::Fenced => {
                self.inner.metrics.fenced_writes.inc();
                tracing::warn!(%identity, epoch = epoch.0, "write fenced: lease lost");
                wait(Outcome::LeaseLost)
            }
            // The answer is kept and written as soon as the row is free;
            // the message waits (uncommitted) and finds it stored.
            Stored::Locked(finish) => {
                tracing::warn!(%identity, epoch = epoch.0,
                    "another transaction holds the key's row; its outcome is stored once it lets go");
                self.inner.parked.park(identity.clone(), epoch, finish);
                wait(Outcome::InFlight)
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
}

#[async_trait]
impl Pipeline for Engine {
    async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, Unavailable> {
        Engine::process(self, batch).await
    }

    async fn process_parsed(
        &self,
        batch: &[Incoming],
        parsed: Vec<Parsed>,
    ) -> Result<Vec<Decision>, Unavailable> {
        Engine::process_parsed(self, batch, parsed).await
    }

    fn parser(&self) -> &Parser {
        &self.inner.parser
    }

    fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    fn backoff(&self) -> Backoff {
        self.inner.options.backoff
    }
}

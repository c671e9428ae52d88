//! The engine: from a batch of deliveries to one decision per delivery.
//! No broker types here; transports apply the decisions.

use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::message::{Incoming, Parsed, Parser};
use super::options::EngineOptions;
use super::pipeline::{Pipeline, Unavailable};
use super::provider_gate::ProviderGate;
use crate::backoff::{self, Backoff, Gave};
use crate::handler::Handler;
use crate::health::Health;
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};
use crate::telemetry::spans::BatchTrace;
use async_trait::async_trait;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The leased engine: claims a batch's keys in PostgreSQL, runs the
/// handlers of the keys it won while renewing their leases, stores their
/// outcomes fenced by epoch, and returns one [`Decision`] per message.
/// Clones share one engine.
#[derive(Clone)]
pub struct Engine {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub store: Store,
    pub handler: Arc<dyn Handler>,
    pub parser: Parser,
    pub options: EngineOptions,
    pub permits: Arc<Semaphore>,
    pub metrics: Metrics,
    pub health: Health,
    pub shutdown: CancellationToken,
    /// Provider-wide outages: pauses intake, lets one probe through.
    pub gate: ProviderGate,
    /// Keys retried in a row without using an attempt (configuration
    /// faults, a provider still working on the key): their backoff grows.
    pub streaks: Mutex<HashMap<Identity, u32>>,
    /// Keys whose answer is kept for a row another transaction holds
    /// (see `parked.rs`).
    pub parked: Mutex<HashSet<Identity>>,
}

/// A parsed message and its position in the batch.
pub(super) struct Pending {
    pub index: usize,
    pub parsed: Parsed,
    /// The message's trace span (disabled when traces are off).
    pub span: tracing::Span,
    /// Test-only: the handler's outcome when it ran before the claim.
    #[cfg(feature = "broken-claim-after-work")]
    pub early: Option<crate::handler::HandlerOutcome>,
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
        Self::with_health(
            store,
            handler,
            parser,
            options,
            metrics,
            Health::default(),
            shutdown,
        )
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
        let permits = Arc::new(Semaphore::new(options.concurrency));
        let gate = ProviderGate::new(
            options.outage_after,
            options.backoff,
            metrics.clone(),
            health.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                store,
                handler,
                parser,
                options,
                permits,
                metrics,
                health,
                shutdown,
                gate,
                streaks: Mutex::default(),
                parked: Mutex::default(),
            }),
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
        let trace = BatchTrace::open(batch);
        let span = trace.span().clone();
        self.process_traced(batch, &trace).instrument(span).await
    }

    async fn process_traced(
        &self,
        batch: &[Incoming],
        trace: &BatchTrace,
    ) -> Result<Vec<Decision>, Unavailable> {
        let mut decisions: Vec<Option<Decision>> = vec![None; batch.len()];
        let mut pending = Vec::new();
        for (index, msg) in batch.iter().enumerate() {
            match self.inner.parser.parse(msg) {
                Ok(parsed) => pending.push(Pending {
                    index,
                    parsed,
                    span: trace.message(index).clone(),
                    #[cfg(feature = "broken-claim-after-work")]
                    early: None,
                }),
                Err(reason) => decisions[index] = Some(Decision::invalid(reason)),
            }
        }
        #[cfg(feature = "broken-claim-after-work")]
        self.work_before_claiming(batch, &mut pending).await;
        if self.inner.gate.paused().is_some() {
            pending = self.probe(batch, pending, &mut decisions).await?;
        }
        // A statement may touch a row once, and messages with one key must
        // be handled in order: the first of each key goes first, repeats
        // in later rounds (where they find the first one's result).
        while !pending.is_empty() {
            let (round, later) = split_first_occurrences(pending);
            for chunk in round.chunks(self.inner.options.max_batch) {
                self.run_round(batch, chunk, &mut decisions).await?;
            }
            pending = later;
        }
        let decisions: Vec<Decision> = batch
            .iter()
            .zip(decisions)
            .map(|(msg, d)| {
                let d = d.unwrap_or_else(|| retry_soon(&self.inner.options, Outcome::InFlight));
                limit_retries(msg, d)
            })
            .collect();
        for (index, (msg, decision)) in batch.iter().zip(&decisions).enumerate() {
            self.record(msg, decision);
            trace.decided(
                index,
                decision.identity.as_ref(),
                decision.epoch,
                decision.outcome.label(),
            );
        }
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

    /// Test-only: the naive order (work first, then record the key), so
    /// the tests and the chaos run can show that they catch it.
    #[cfg(feature = "broken-claim-after-work")]
    async fn work_before_claiming(&self, batch: &[Incoming], pending: &mut [Pending]) {
        let runs = pending.iter().map(|p| async {
            let msg = &batch[p.index];
            let call = crate::handler::HandlerCall {
                identity: &p.parsed.identity,
                derived_key: &p.parsed.derived_key,
                request: crate::handler::Request {
                    body: &msg.body,
                    content_type: msg.content_type.as_deref(),
                },
                headers: &msg.headers,
                attempt: 1,
                epoch: crate::identity::Epoch(0),
                owner: &self.inner.options.owner,
                lease_deadline: chrono::Utc::now() + self.inner.options.lease,
                source: &msg.source,
                uncertain: false,
            };
            self.inner.handler.handle(&call).await
        });
        let outcomes = futures::future::join_all(runs).await;
        for (p, outcome) in pending.iter_mut().zip(outcomes) {
            p.early = Some(outcome);
        }
    }

    /// Retries a store write through an outage: the result is only in
    /// memory, so it is worth waiting for PostgreSQL to come back, however
    /// long (read-only after a failover, timeouts, out of disk). Gives up
    /// on shutdown (nothing is committed; the message comes back) or on an
    /// error that belongs to the row (see [`StoreError`]).
    pub(super) async fn store_retry<T, F, Fut>(&self, write: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let got = backoff::wait_out(
            self.inner.options.backoff,
            &self.inner.shutdown,
            StoreError::is_transient,
            |e, attempt, _| {
                self.store_failed(e);
                tracing::warn!(error = %crate::telemetry::chain(e), attempt, "store write failed; retrying");
            },
            write,
        )
        .await
        .map_err(|gave| {
            if let Gave::Up(e) = &gave {
                self.store_failed(e);
            }
            gave.into_inner()
        });
        if got.is_ok() {
            self.store_worked();
        }
        got
    }

    /// Counts a failed key-table statement by its SQLSTATE class, and tells
    /// /readyz that writes fail (with the SQLSTATE) while they do.
    pub(super) fn store_failed(&self, e: &StoreError) {
        self.inner.metrics.store_error(e);
        if e.is_transient() {
            self.inner.health.store_writes_failed(e);
        }
    }

    /// A key-table write went through: writes work again.
    pub(super) fn store_worked(&self) {
        self.inner.health.store_writes_work();
    }
}

#[async_trait]
impl Pipeline for Engine {
    async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, Unavailable> {
        Engine::process(self, batch).await
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

/// Nothing decided yet: look again after the shortest backoff.
pub(super) fn retry_soon(opts: &EngineOptions, outcome: Outcome) -> Decision {
    Decision {
        outcome,
        action: Action::RetryLater {
            after: opts.backoff.min,
        },
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

/// Splits off the first message of every identity; the rest keep order.
fn split_first_occurrences(pending: Vec<Pending>) -> (Vec<Pending>, Vec<Pending>) {
    let mut seen = HashSet::new();
    pending
        .into_iter()
        .partition(|p| seen.insert(p.parsed.identity.clone()))
}

//! The engine: from a batch of deliveries to one decision per delivery.
//! No broker types here; transports apply the decisions.

use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::message::{Incoming, Parsed, Parser, Source};
use super::options::EngineOptions;
use crate::handler::Handler;
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::store::{ClaimRequest, ClaimResult, Store, StoreError};
use chrono::Utc;
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often a claim that raced a concurrent claimer is retried at once.
const CONTENDED_RETRIES: usize = 3;

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
    pub shutdown: CancellationToken,
}

/// A parsed message and its position in the batch.
pub(super) struct Pending {
    pub index: usize,
    pub parsed: Parsed,
    /// Test-only: the handler's outcome when it ran before the claim.
    #[cfg(feature = "broken-claim-after-work")]
    pub early: Option<crate::handler::HandlerOutcome>,
}

impl Engine {
    pub fn new(
        store: Store,
        handler: Arc<dyn Handler>,
        parser: Parser,
        options: EngineOptions,
        metrics: Metrics,
        shutdown: CancellationToken,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(options.concurrency));
        Self {
            inner: Arc::new(Inner {
                store,
                handler,
                parser,
                options,
                permits,
                metrics,
                shutdown,
            }),
        }
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The identity rules: transports that have a fallback place for the
    /// key (AMQP's message_id) need the header name.
    pub fn parser(&self) -> &Parser {
        &self.inner.parser
    }

    pub fn options(&self) -> &EngineOptions {
        &self.inner.options
    }

    /// Decides every message of the batch: claims in one round trip per
    /// round, runs the won claims' handlers, stores their outcomes. Returns
    /// one decision per message, in order. An error means nothing of the
    /// batch may be committed; deliver it again later.
    pub async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, StoreError> {
        let mut decisions: Vec<Option<Decision>> = vec![None; batch.len()];
        let mut pending = Vec::new();
        for (index, msg) in batch.iter().enumerate() {
            match self.inner.parser.parse(msg) {
                Ok(parsed) => pending.push(Pending {
                    index,
                    parsed,
                    #[cfg(feature = "broken-claim-after-work")]
                    early: None,
                }),
                Err(reason) => decisions[index] = Some(Decision::invalid(reason)),
            }
        }
        #[cfg(feature = "broken-claim-after-work")]
        self.work_before_claiming(batch, &mut pending).await;
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
        let decisions: Vec<Decision> = decisions
            .into_iter()
            .map(|d| d.unwrap_or_else(|| retry_soon(&self.inner.options, None, Outcome::InFlight)))
            .collect();
        for (msg, decision) in batch.iter().zip(&decisions) {
            self.record(msg, decision);
        }
        Ok(decisions)
    }

    /// Test-only: the naive order (work first, then record the key), so
    /// the tests and the chaos run can show that they catch it.
    #[cfg(feature = "broken-claim-after-work")]
    async fn work_before_claiming(&self, batch: &[Incoming], pending: &mut [Pending]) {
        let runs = pending.iter().map(|p| async {
            let derived_key = p.parsed.identity.derived_key();
            let call = crate::handler::HandlerCall {
                identity: &p.parsed.identity,
                derived_key: &derived_key,
                body: &p.parsed.body,
                attempt: 1,
                epoch: crate::identity::Epoch(0),
                owner: &self.inner.options.owner,
                lease_deadline: Utc::now() + self.inner.options.lease,
                source: &batch[p.index].source,
            };
            self.inner.handler.handle(&call).await
        });
        let outcomes = futures::future::join_all(runs).await;
        for (p, outcome) in pending.iter_mut().zip(outcomes) {
            p.early = Some(outcome);
        }
    }

    async fn run_round(
        &self,
        batch: &[Incoming],
        round: &[Pending],
        decisions: &mut [Option<Decision>],
    ) -> Result<(), StoreError> {
        let claimed_at = Instant::now();
        let lease_deadline = Utc::now() + self.inner.options.lease;
        let results = self.claim_with_retries(round).await?;
        let mut won = Vec::new();
        for (p, result) in round.iter().zip(results) {
            let opts = &self.inner.options;
            let decision = |outcome, action| Decision {
                outcome,
                action,
                identity: Some(p.parsed.identity.clone()),
                fingerprint: Some(p.parsed.fingerprint.clone()),
                epoch: None,
            };
            decisions[p.index] = Some(match result {
                ClaimResult::Won { epoch, attempts } => {
                    won.push((p, epoch, attempts, Outcome::Processed));
                    continue;
                }
                ClaimResult::TakenOver { epoch, attempts } => {
                    self.inner.metrics.takeovers.inc();
                    won.push((p, epoch, attempts, Outcome::Takeover));
                    continue;
                }
                ClaimResult::Duplicate(stored) => decision(
                    Outcome::Duplicate,
                    Action::Commit {
                        reply: Some(stored),
                    },
                ),
                ClaimResult::Held { lease_until } => {
                    let left = (lease_until - Utc::now()).to_std().unwrap_or_default();
                    decision(
                        Outcome::InFlight,
                        Action::RetryLater {
                            after: opts.backoff.for_held(left),
                        },
                    )
                }
                ClaimResult::Conflict => decision(
                    Outcome::Conflict,
                    Action::DeadLetter {
                        reason: DeadLetterReason::Conflict,
                        detail: "this key was already used for a different operation \
                                 (the fingerprint differs)"
                            .into(),
                    },
                ),
                ClaimResult::Contended => {
                    retry_soon(opts, Some(&p.parsed.identity), Outcome::InFlight)
                }
            });
        }
        if !won.is_empty() {
            self.run_claimed(batch, won, claimed_at, lease_deadline, decisions)
                .await?;
        }
        Ok(())
    }

    /// Claims the round; requests that raced a concurrent claimer's insert
    /// are claimed again (a few times) to learn the row's real state.
    async fn claim_with_retries(&self, round: &[Pending]) -> Result<Vec<ClaimResult>, StoreError> {
        let inner = &self.inner;
        let mut results = vec![ClaimResult::Contended; round.len()];
        let mut todo: Vec<usize> = (0..round.len()).collect();
        for _ in 0..CONTENDED_RETRIES {
            let requests: Vec<ClaimRequest> = todo
                .iter()
                .map(|&i| ClaimRequest {
                    identity: &round[i].parsed.identity,
                    fingerprint: &round[i].parsed.fingerprint,
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
                .await
                .inspect_err(|_| inner.metrics.store_errors.inc())?;
            timer.observe_duration();
            let mut again = Vec::new();
            for (&i, r) in todo.iter().zip(got) {
                inner
                    .metrics
                    .claims
                    .with_label_values(&[claim_label(&r)])
                    .inc();
                if r == ClaimResult::Contended {
                    again.push(i);
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

    /// Retries a store write through an outage: the result is only in
    /// memory, so it is worth waiting for PostgreSQL to come back. Gives up
    /// on shutdown (nothing is committed; the message comes back).
    pub(super) async fn store_retry<T, F, Fut>(&self, mut write: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let backoff = self.inner.options.backoff;
        let mut attempt = 1;
        loop {
            match write().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transient() => {
                    self.inner.metrics.store_errors.inc();
                    tracing::warn!(error = %e, attempt, "store write failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.after_attempt(attempt)) => {}
                        _ = self.inner.shutdown.cancelled() => return Err(e),
                    }
                    attempt += 1;
                }
                Err(e) => {
                    self.inner.metrics.store_errors.inc();
                    return Err(e);
                }
            }
        }
    }

    fn record(&self, msg: &Incoming, d: &Decision) {
        let m = &self.inner.metrics;
        let transport = transport_label(&msg.source);
        m.messages
            .with_label_values(&[transport, d.outcome.label()])
            .inc();
        if let Action::DeadLetter { reason, .. } = &d.action {
            m.dead_letters.with_label_values(&[reason.label()]).inc();
        }
        let (tenant, key) = d
            .identity
            .as_ref()
            .map(|i| (i.tenant.as_str(), i.key.as_str()))
            .unwrap_or_default();
        let epoch = d.epoch.map(|e| e.0);
        match d.outcome {
            Outcome::Processed | Outcome::Duplicate | Outcome::InFlight => tracing::debug!(
                tenant, key, epoch, outcome = d.outcome.label(), source = %msg.source, "message decided"
            ),
            _ => tracing::info!(
                tenant, key, epoch, outcome = d.outcome.label(), source = %msg.source,
                action = ?action_label(&d.action), "message decided"
            ),
        }
    }
}

fn action_label(a: &Action) -> String {
    match a {
        Action::Commit { .. } => "commit".into(),
        Action::DeadLetter { reason, detail } => {
            format!("dead_letter({}: {detail})", reason.label())
        }
        Action::RetryLater { after } => format!("retry_later({after:?})"),
    }
}

pub fn transport_label(source: &Source) -> &'static str {
    match source {
        Source::Kafka { .. } => "kafka",
        Source::Amqp { .. } => "amqp",
        Source::Http { .. } => "http",
        Source::Direct { .. } => "direct",
    }
}

fn claim_label(r: &ClaimResult) -> &'static str {
    match r {
        ClaimResult::Won { .. } => "won",
        ClaimResult::TakenOver { .. } => "takeover",
        ClaimResult::Duplicate(_) => "duplicate",
        ClaimResult::Held { .. } => "held",
        ClaimResult::Conflict => "conflict",
        ClaimResult::Contended => "contended",
    }
}

pub(super) fn retry_soon(
    opts: &EngineOptions,
    identity: Option<&Identity>,
    outcome: Outcome,
) -> Decision {
    Decision {
        outcome,
        action: Action::RetryLater {
            after: opts.backoff.min,
        },
        identity: identity.cloned(),
        fingerprint: None,
        epoch: None,
    }
}

/// Splits off the first message of every identity; the rest keep order.
fn split_first_occurrences(pending: Vec<Pending>) -> (Vec<Pending>, Vec<Pending>) {
    let mut seen = HashSet::new();
    pending
        .into_iter()
        .partition(|p| seen.insert(p.parsed.identity.clone()))
}

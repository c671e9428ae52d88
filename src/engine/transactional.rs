//! Same-database mode: the handler writes to the same PostgreSQL inside
//! the claim's transaction, so claim, work and result commit together or
//! not at all. No lease, no renewal, no fencing needed. What a claim that
//! settles its message decides, and what every decision leaves behind, are
//! the same as in the leased engine (`settle.rs`, `record.rs`).

use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::message::{Incoming, Parsed, Parser};
use super::options::EngineOptions;
use super::pipeline::{Pipeline, Unavailable};
use super::record::record;
use super::settle::{limit_retries, settled, stored};
use crate::backoff::Backoff;
use crate::handler::{HandlerCall, HandlerResult, Request};
use crate::identity::Epoch;
use crate::metrics::Metrics;
use crate::store::{ClaimRequest, KeyStatus, Store, StoreError, TxClaim};
use crate::telemetry::spans::{self, BatchTrace};
use async_trait::async_trait;
use chrono::Utc;
use futures::stream::{self, StreamExt};
use sqlx::{PgConnection, Postgres, Transaction};
use std::sync::Arc;
use tracing::{Instrument, Span};

/// Why a transactional handler did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub enum TxFailure {
    /// Stored as failed (the handler's own writes are rolled back).
    Permanent(HandlerResult),
    /// Everything is rolled back, the claim included; the message is
    /// retried later, and dead-lettered (`exhausted_retries`, the key left
    /// free) once it has had `engine.max_attempts` attempts.
    Transient(String),
}

/// A handler whose work is SQL on the claim's own connection: its writes
/// commit together with the key's result, or not at all. No provider key is
/// needed for exactly-once: a crash before the commit leaves neither.
///
/// Behind the same transports through
/// [`Application::build_transactional`](crate::startup::Application::build_transactional);
/// `examples/ledger.rs` is a complete program.
///
/// A handler that books one ledger row per payment in the claim's
/// transaction:
///
/// ```no_run
/// use dedupq::engine::{TransactionalHandler, TxFailure};
/// use dedupq::handler::{HandlerCall, HandlerResult};
/// use serde_json::json;
/// use sqlx::PgConnection;
///
/// /// Books `amount` (in cents) for the payment's tenant and key.
/// struct Ledger;
///
/// #[derive(serde::Deserialize)]
/// struct Entry {
///     amount: i64,
/// }
///
/// #[async_trait::async_trait]
/// impl TransactionalHandler for Ledger {
///     async fn handle(
///         &self,
///         conn: &mut PgConnection,
///         call: &HandlerCall<'_>,
///     ) -> Result<HandlerResult, TxFailure> {
///         let entry: Entry = call.json().map_err(|e| {
///             let body = json!({ "error": format!("not a ledger entry: {e}") });
///             TxFailure::Permanent(HandlerResult::json(422, &body))
///         })?;
///         // In the claim's transaction: committed with the key's result.
///         let id: i64 = sqlx::query_scalar(
///             "INSERT INTO ledger (tenant, key, amount) VALUES ($1, $2, $3) RETURNING id",
///         )
///         .bind(call.identity.tenant.as_str())
///         .bind(call.identity.key.as_str())
///         .bind(entry.amount)
///         .fetch_one(&mut *conn)
///         .await
///         .map_err(|e| TxFailure::Transient(e.to_string()))?;
///         let body = json!({ "entry": id, "amount": entry.amount });
///         Ok(HandlerResult::json(201, &body))
///     }
/// }
/// ```
#[async_trait]
pub trait TransactionalHandler: Send + Sync + 'static {
    /// Does the work on `conn`, inside the transaction that claimed the
    /// key (never commit or roll it back here). `Ok` commits the writes with the result stored `done`;
    /// [`TxFailure::Permanent`] rolls the writes back and stores `failed`;
    /// [`TxFailure::Transient`] rolls everything back, the claim included.
    /// A handler still running after `handler.timeout` is abandoned and
    /// rolled back like a transient failure.
    async fn handle(
        &self,
        conn: &mut PgConnection,
        call: &HandlerCall<'_>,
    ) -> Result<HandlerResult, TxFailure>;
}

/// The same-database engine: one transaction per message claims the key,
/// runs the [`TransactionalHandler`] on its connection and stores the
/// result, so a crash leaves none of them.
pub struct TransactionalEngine {
    store: Store,
    handler: Arc<dyn TransactionalHandler>,
    parser: Parser,
    options: EngineOptions,
    metrics: Metrics,
}

impl TransactionalEngine {
    /// An engine over `store`, reading messages with `parser`.
    pub fn new(
        store: Store,
        handler: Arc<dyn TransactionalHandler>,
        parser: Parser,
        options: EngineOptions,
        metrics: Metrics,
    ) -> Self {
        Self {
            store,
            handler,
            parser,
            options,
            metrics,
        }
    }

    /// One transaction per message, up to `concurrency` at once.
    /// Spans as the leased engine makes them: `dedupq.batch`, one
    /// `dedupq.message` per message continued from its `traceparent`, and
    /// `dedupq.handler` around each handler call.
    pub async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, StoreError> {
        let trace = BatchTrace::open(batch);
        let runs: Vec<_> = batch
            .iter()
            .enumerate()
            .map(|(i, msg)| {
                let span = trace.message(i).clone();
                self.process_one(msg, span.clone()).instrument(span)
            })
            .collect();
        let decisions: Vec<Result<Decision, StoreError>> = stream::iter(runs)
            .buffered(self.options.concurrency)
            .collect()
            .instrument(trace.span().clone())
            .await;
        let decisions: Vec<Decision> = decisions
            .into_iter()
            .zip(batch)
            .map(|(d, msg)| d.map(|d| limit_retries(msg, d)))
            .collect::<Result<_, _>>()?;
        record(&self.metrics, &trace, batch, &decisions);
        Ok(decisions)
    }

    async fn process_one(&self, msg: &Incoming, span: Span) -> Result<Decision, StoreError> {
        let parsed = match self.parser.parse(msg) {
            Ok(p) => p,
            Err(reason) => return Ok(Decision::invalid(reason)),
        };
        let request = ClaimRequest {
            identity: &parsed.identity,
            fingerprint: &parsed.fingerprint,
            body: &msg.body,
            content_type: msg.content_type.as_deref(),
            derived_key: &parsed.derived_key,
            route: parsed.route.as_deref(),
        };
        match self
            .store
            .claim_in_transaction(&request, &self.options.owner)
            .await?
        {
            TxClaim::Owned(tx) => self.run_in(tx, msg, &parsed, span).await,
            TxClaim::Settled(result) => Ok(settled(result, &parsed, self.options.backoff)),
        }
    }

    /// Runs the handler inside the claim's transaction `tx` and commits its
    /// writes with the result; a permanent failure keeps only the result,
    /// a transient one (or a timeout) nothing.
    async fn run_in(
        &self,
        mut tx: Transaction<'static, Postgres>,
        msg: &Incoming,
        parsed: &Parsed,
        span: Span,
    ) -> Result<Decision, StoreError> {
        // Nothing of a rolled-back attempt is stored, so the attempts are
        // the times the transport brought the message back.
        let attempt = msg.retries.saturating_add(1);
        let call = self.call(msg, parsed, attempt);
        let timeout = self.options.handler_timeout;
        Store::begin_handler(&mut tx, timeout).await?;
        let handler_span = spans::handler(&span, attempt, Epoch(1));
        let call_handler = self.handler.handle(&mut tx, &call);
        let Ok(ran) =
            tokio::time::timeout(timeout, call_handler.instrument(handler_span.clone())).await
        else {
            spans::handled(&handler_span, "transient", false);
            // The connection may still be running the handler's statement:
            // dropping the transaction rolls it back once that ends, without
            // waiting for it here.
            drop(tx);
            let error = format!(
                "the handler did not finish within handler.timeout ({})",
                humantime::format_duration(timeout)
            );
            return Ok(self.not_done(parsed, attempt, error));
        };
        handled(&handler_span, &ran);
        let (outcome, reply) = match ran {
            Ok(r) => (Outcome::Processed, stored(KeyStatus::Done, r)),
            Err(TxFailure::Permanent(r)) => {
                Store::roll_back_handler(&mut tx).await?;
                (Outcome::Failed, stored(KeyStatus::Failed, r))
            }
            Err(TxFailure::Transient(error)) => {
                tx.rollback().await?;
                return Ok(self.not_done(parsed, attempt, error));
            }
        };
        Store::finish_in_transaction(&mut tx, &parsed.identity, &reply).await?;
        tx.commit().await?;
        Ok(Decision::about(
            outcome,
            Action::Commit { reply: Some(reply) },
            parsed,
        ))
    }

    fn call<'a>(&'a self, msg: &'a Incoming, parsed: &'a Parsed, attempt: u32) -> HandlerCall<'a> {
        HandlerCall {
            identity: &parsed.identity,
            derived_key: &parsed.derived_key,
            request: Request {
                body: &msg.body,
                content_type: msg.content_type.as_deref(),
            },
            headers: &msg.headers,
            attempt,
            epoch: Epoch(1),
            owner: &self.options.owner,
            lease_deadline: Utc::now() + self.options.handler_timeout,
            source: &msg.source,
            uncertain: false,
        }
    }

    /// A rolled-back attempt: nothing of it happened and nothing is stored
    /// for the key, so the message is retried, and after
    /// `engine.max_attempts` dead-lettered with the key still free (a
    /// replay of the dead letter runs the work afresh).
    fn not_done(&self, parsed: &Parsed, attempt: u32, error: String) -> Decision {
        let identity = &parsed.identity;
        if attempt >= self.options.max_attempts {
            tracing::warn!(%identity, attempt, %error, "transactional handler failed on its last attempt; dead-lettered");
            let action = Action::DeadLetter {
                reason: DeadLetterReason::ExhaustedRetries,
                detail: format!("{attempt} attempts failed; last error: {error}"),
            };
            return Decision::about(Outcome::Failed, action, parsed);
        }
        tracing::info!(%identity, attempt, %error, "transactional handler failed; retrying later");
        let after = self.options.backoff.after_attempt(attempt);
        Decision::about(Outcome::Retried, Action::RetryLater { after }, parsed)
    }
}

/// Records the handler's outcome on its span, as the leased engine's
/// handler outcomes are labelled.
fn handled(span: &Span, ran: &Result<HandlerResult, TxFailure>) {
    let (label, answered) = match ran {
        Ok(_) => ("success", true),
        Err(TxFailure::Permanent(_)) => ("permanent", true),
        Err(TxFailure::Transient(_)) => ("transient", false),
    };
    spans::handled(span, label, answered);
}

#[async_trait]
impl Pipeline for TransactionalEngine {
    async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, Unavailable> {
        Ok(TransactionalEngine::process(self, batch).await?)
    }

    fn parser(&self) -> &Parser {
        &self.parser
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn backoff(&self) -> Backoff {
        self.options.backoff
    }
}

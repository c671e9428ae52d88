//! Same-database mode (DESIGN section 2): the handler writes to the same
//! PostgreSQL inside the claim's transaction, so claim, work and result
//! commit together or not at all. No lease, no renewal, no fencing needed.

use super::core::{limit_retries, transport_label};
use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::message::{Incoming, Parser};
use super::options::EngineOptions;
use super::pipeline::Pipeline;
use crate::backoff::Backoff;
use crate::handler::{HandlerCall, HandlerResult, Request};
use crate::metrics::Metrics;
use crate::store::{
    ClaimRequest, ClaimResult, KeyStatus, Store, StoreError, StoredResult, TxClaim,
};
use async_trait::async_trait;
use chrono::Utc;
use futures::stream::{self, StreamExt};
use sqlx::PgConnection;
use std::sync::Arc;

/// Why a transactional handler did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub enum TxFailure {
    /// Stored as failed (the handler's own writes are rolled back).
    Permanent(HandlerResult),
    /// Everything is rolled back; the message is retried later.
    Transient(String),
}

/// A handler whose work is SQL on the claim's own connection: its writes
/// commit together with the key's result, or not at all. No provider key is
/// needed for exactly-once: a crash before the commit leaves neither.
///
/// ```
/// use dedupq::engine::{TransactionalHandler, TxFailure};
/// use dedupq::handler::{HandlerCall, HandlerResult};
/// use sqlx::PgConnection;
///
/// struct Ledger;
///
/// #[async_trait::async_trait]
/// impl TransactionalHandler for Ledger {
///     async fn handle(
///         &self,
///         conn: &mut PgConnection,
///         call: &HandlerCall<'_>,
///     ) -> Result<HandlerResult, TxFailure> {
///         let entry: serde_json::Value = call
///             .json()
///             .map_err(|e| TxFailure::Permanent(HandlerResult::json(400, &serde_json::json!({"error": e.to_string()}))))?;
///         sqlx::query("INSERT INTO ledger (tenant, key, amount) VALUES ($1, $2, $3)")
///             .bind(call.identity.tenant.as_str())
///             .bind(call.identity.key.as_str())
///             .bind(entry["amount"].as_i64().unwrap_or(0))
///             .execute(conn)
///             .await
///             .map_err(|e| TxFailure::Transient(e.to_string()))?;
///         Ok(HandlerResult::json(201, &entry))
///     }
/// }
/// ```
#[async_trait]
pub trait TransactionalHandler: Send + Sync + 'static {
    async fn handle(
        &self,
        conn: &mut PgConnection,
        call: &HandlerCall<'_>,
    ) -> Result<HandlerResult, TxFailure>;
}

pub struct TransactionalEngine {
    store: Store,
    handler: Arc<dyn TransactionalHandler>,
    parser: Parser,
    options: EngineOptions,
    metrics: Metrics,
}

impl TransactionalEngine {
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
    pub async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, StoreError> {
        let runs: Vec<_> = batch.iter().map(|msg| self.process_one(msg)).collect();
        let decisions: Vec<Result<Decision, StoreError>> = stream::iter(runs)
            .buffered(self.options.concurrency)
            .collect()
            .await;
        let decisions: Vec<Decision> = decisions
            .into_iter()
            .zip(batch)
            .map(|(d, msg)| d.map(|d| limit_retries(msg, d)))
            .collect::<Result<_, _>>()?;
        for (msg, d) in batch.iter().zip(&decisions) {
            self.metrics
                .messages
                .with_label_values(&[transport_label(&msg.source), d.outcome.label()])
                .inc();
        }
        Ok(decisions)
    }

    async fn process_one(&self, msg: &Incoming) -> Result<Decision, StoreError> {
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
        };
        let decided = |outcome, action| Decision {
            outcome,
            action,
            identity: Some(parsed.identity.clone()),
            fingerprint: Some(parsed.fingerprint.clone()),
            epoch: None,
        };
        let mut tx = match self
            .store
            .claim_in_transaction(&request, &self.options.owner)
            .await?
        {
            TxClaim::Owned(tx) => tx,
            TxClaim::Settled(ClaimResult::Duplicate(stored)) => {
                return Ok(decided(
                    Outcome::Duplicate,
                    Action::Commit {
                        reply: Some(stored),
                    },
                ))
            }
            TxClaim::Settled(ClaimResult::HeldUnknown { .. }) => {
                return Ok(decided(
                    Outcome::Unknown,
                    Action::Commit {
                        reply: Some(StoredResult::unknown()),
                    },
                ))
            }
            TxClaim::Settled(ClaimResult::Conflict) => {
                return Ok(decided(
                    Outcome::Conflict,
                    Action::DeadLetter {
                        reason: DeadLetterReason::Conflict,
                        detail: "this key was already used for a different operation".into(),
                    },
                ))
            }
            TxClaim::Settled(_) => {
                let after = self.options.backoff.min;
                return Ok(decided(Outcome::InFlight, Action::RetryLater { after }));
            }
        };
        let call = HandlerCall {
            identity: &parsed.identity,
            derived_key: &parsed.derived_key,
            request: Request {
                body: &msg.body,
                content_type: msg.content_type.as_deref(),
            },
            headers: &msg.headers,
            attempt: 1,
            epoch: crate::identity::Epoch(1),
            owner: &self.options.owner,
            lease_deadline: Utc::now() + self.options.handler_timeout,
            source: &msg.source,
            uncertain: false,
        };
        sqlx::query("SAVEPOINT dedupq_handler")
            .execute(&mut *tx)
            .await?;
        let (outcome, reply) = match self.handler.handle(&mut tx, &call).await {
            Ok(r) => (Outcome::Processed, stored(KeyStatus::Done, r)),
            Err(TxFailure::Permanent(r)) => {
                sqlx::query("ROLLBACK TO SAVEPOINT dedupq_handler")
                    .execute(&mut *tx)
                    .await?;
                (Outcome::Failed, stored(KeyStatus::Failed, r))
            }
            Err(TxFailure::Transient(error)) => {
                tx.rollback().await?;
                tracing::info!(identity = %parsed.identity, %error, "transactional handler failed; retrying later");
                let after = self.options.backoff.after_attempt(1);
                return Ok(decided(Outcome::Retried, Action::RetryLater { after }));
            }
        };
        Store::finish_in_transaction(&mut tx, &parsed.identity, &reply).await?;
        tx.commit().await?;
        Ok(decided(outcome, Action::Commit { reply: Some(reply) }))
    }
}

fn stored(status: KeyStatus, r: HandlerResult) -> StoredResult {
    StoredResult {
        status,
        result_status: r.status,
        body: r.body,
        content_type: r.content_type,
    }
}

#[async_trait]
impl Pipeline for TransactionalEngine {
    async fn process(&self, batch: &[Incoming]) -> Result<Vec<Decision>, StoreError> {
        TransactionalEngine::process(self, batch).await
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

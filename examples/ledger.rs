//! Same-database mode behind Kafka: every payment command becomes one row
//! of a ledger table in the PostgreSQL that holds the keys, written in the
//! claim's own transaction. Exactly once without any provider key: a crash
//! before the commit leaves neither the key's result nor the ledger row.
//!
//! ```sh
//! DEDUPQ__KAFKA__TOPICS='["payments"]' cargo run --example ledger -- dedupq.toml
//! ```
//!
//! The configuration is dedupq's own (`[store]`, `[kafka]`, `[identity]`,
//! …); `[handler]` is not used. The ledger table is created in the key
//! table's schema if it does not exist.

use async_trait::async_trait;
use dedupq::{Application, HandlerCall, HandlerResult, Settings, TransactionalHandler, TxFailure};
use serde_json::json;
use sqlx::PgConnection;
use std::sync::Arc;

/// Books `amount` (in cents) for the payment's tenant and key.
pub struct Ledger;

#[derive(serde::Deserialize)]
struct Entry {
    amount: i64,
}

#[async_trait]
impl TransactionalHandler for Ledger {
    async fn handle(
        &self,
        conn: &mut PgConnection,
        call: &HandlerCall<'_>,
    ) -> Result<HandlerResult, TxFailure> {
        let entry: Entry = call.json().map_err(|e| {
            TxFailure::Permanent(HandlerResult::json(
                422,
                &json!({ "error": format!("not a ledger entry: {e}") }),
            ))
        })?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO ledger (tenant, key, amount) VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(call.identity.tenant.as_str())
        .bind(call.identity.key.as_str())
        .bind(entry.amount)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| TxFailure::Transient(e.to_string()))?;
        Ok(HandlerResult::json(
            201,
            &json!({ "entry": id, "amount": entry.amount }),
        ))
    }
}

#[tokio::main]
#[allow(dead_code)]
async fn main() -> anyhow::Result<()> {
    let file = std::env::args().nth(1).map(std::path::PathBuf::from);
    let settings = Settings::load(file.as_deref())?;
    dedupq::telemetry::init(&settings.log);
    run(settings, Arc::new(Ledger)).await
}

/// Creates the ledger table if needed and consumes until stopped.
pub async fn run(settings: Settings, handler: Arc<dyn TransactionalHandler>) -> anyhow::Result<()> {
    let app = Application::build_transactional(settings, handler).await?;
    // Deliberately no unique constraint: a second booking of one payment
    // must show as a second row, not hide behind an error.
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS ledger (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             tenant text NOT NULL,
             key text NOT NULL,
             amount bigint NOT NULL,
             booked_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(app.store().pool())
    .await?;
    app.run_until_stopped().await
}

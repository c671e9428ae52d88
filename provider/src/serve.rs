//! Serving the simulator: its schema, its pool, its HTTP API.

use crate::ledger::{Ledger, LedgerError};
use crate::{api, KnobError, Knobs};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::Executor;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("the provider's database is unreachable or refused the schema")]
    Database(#[from] sqlx::Error),
    #[error("the provider's schema cannot be used")]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Knobs(#[from] KnobError),
    #[error("serving HTTP failed")]
    Serve(#[from] std::io::Error),
}

/// Serves the simulator on `listener` until `shutdown`, keeping charges in
/// `schema` of the database at `database_url`.
pub async fn serve(
    listener: TcpListener,
    database_url: &str,
    schema: &str,
    knobs: Knobs,
    shutdown: CancellationToken,
) -> Result<(), ProviderError> {
    knobs.validate()?;
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await?;
    admin
        .execute(
            format!(
                "CREATE SCHEMA IF NOT EXISTS \"{}\"",
                schema.replace('"', "\"\"")
            )
            .as_str(),
        )
        .await?;
    admin.close().await;
    let options = PgConnectOptions::from_str(database_url)?
        .application_name("dedupq-provider")
        .options([("search_path", schema)]);
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await?;
    let state = api::AppState {
        ledger: Ledger::open(pool).await?,
        knobs: Arc::new(Mutex::new(knobs)),
    };
    axum::serve(listener, api::router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}

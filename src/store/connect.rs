//! The connection pool behind [`Store`]: built lazily, sized for batched
//! statements, and failing fast while PostgreSQL is down.

use super::StoreError;
use crate::config::{check_schema_name, StoreSettings};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;

/// A handle on the key table. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: PgPool,
}

impl Store {
    /// Builds the pool without touching the network, so a process can start
    /// (and report not-ready) while PostgreSQL is still down.
    pub fn connect_lazy(settings: &StoreSettings) -> Result<Self, StoreError> {
        let mut options = PgConnectOptions::from_str(settings.url.expose())
            .map_err(StoreError::Url)?
            .application_name("dedupq");
        if let Some(schema) = &settings.schema {
            // Checked here too, for callers that skip the configuration's
            // validation: the name goes into the startup `options` string,
            // where a space would start another `-c` setting and a comma
            // another search_path entry. Quoted, so its case is kept.
            check_schema_name(schema).map_err(|problem| StoreError::SchemaName {
                name: schema.clone(),
                problem,
            })?;
            options = options.options([("search_path", format!("\"{schema}\""))]);
        }
        let pool = PgPoolOptions::new()
            // Claims and completions are batched, so a few connections carry
            // a lot of traffic; more only add contention on 2-core hosts.
            .max_connections(settings.max_connections)
            // Fail fast while PostgreSQL is down: the engine pauses and
            // retries instead of piling up waiters.
            .acquire_timeout(settings.acquire_timeout)
            // A ping before every acquire would double the round trips of
            // the hot path; a dead connection surfaces as an error instead,
            // which the caller already retries.
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Ok(Self { pool })
    }

    /// A store over a pool built elsewhere, taken as it is (none of the
    /// settings `connect_lazy` applies).
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool itself, for statements outside this module (the scenario
    /// checks, the benchmarks and the tests read the key table directly).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Why a new connection fails right now (None: it succeeds). The pool
    /// only reports that it timed out; this says what an operator can fix
    /// (refused, unknown host, TLS, authentication).
    pub async fn connect_error(&self) -> Option<sqlx::Error> {
        use sqlx::{ConnectOptions, Connection};
        let options = self.pool.connect_options();
        let attempt = options.connect();
        match tokio::time::timeout(self.pool.options().get_acquire_timeout(), attempt).await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                None
            }
            Ok(Err(e)) => Some(e),
            Err(_) => Some(sqlx::Error::PoolTimedOut),
        }
    }

    /// One trivial query: is PostgreSQL reachable right now?
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

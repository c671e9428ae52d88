//! The key table's schema and migrations: applied by one instance at a
//! time, only when something is pending, or only checked (for a runtime
//! role that may not change the schema).

use super::connect::default_planner_sql;
use super::{Store, StoreError};
use crate::config::MigrateMode;
use sqlx::pool::PoolConnection;
use sqlx::{Executor, PgConnection, Postgres};
use std::collections::HashMap;
use std::fmt;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Session advisory lock held across CREATE SCHEMA and the migrations, so
/// instances started together do not race on them ("dedupqmg").
pub const MIGRATE_LOCK: i64 = 0x6465_6475_7071_6d67;

/// PostgreSQL's insufficient_privilege.
const PERMISSION_DENIED: &str = "42501";

/// A migration this build carries that the database has not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The migration's number (`0003` of `0003_hot_finishes.sql`).
    pub version: i64,
    /// The rest of its file name, in words (`hot finishes`).
    pub description: String,
}

impl fmt::Display for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04} {}", self.version, self.description)
    }
}

/// `0001 keys, 0002 audit`.
pub(super) fn list(pending: &[Pending]) -> String {
    let names: Vec<String> = pending.iter().map(ToString::to_string).collect();
    names.join(", ")
}

impl Store {
    /// What `store.migrate` asks for at start-up.
    pub async fn prepare(&self, schema: Option<&str>, mode: MigrateMode) -> Result<(), StoreError> {
        self.check_sessions_kept().await?;
        match mode {
            MigrateMode::Auto => self.migrate(schema).await,
            MigrateMode::Check => self.check_migrated(schema).await,
        }
    }

    /// Creates the schema if configured and applies pending migrations,
    /// one instance at a time. Up to date, it changes nothing, so a role
    /// without DDL rights gets through.
    pub async fn migrate(&self, schema: Option<&str>) -> Result<(), StoreError> {
        let mut conn = self.pool().acquire().await?;
        // Schema changes wait for their table locks (and instances for the
        // migration lock) as long as it takes, not store.lock_timeout; and
        // a migration that copies a table is planned as PostgreSQL would.
        let session = format!("SET lock_timeout = 0; {}", default_planner_sql(false));
        conn.execute(sqlx::raw_sql(&session)).await?;
        if !crate::broken::is(crate::broken::Break::NoMigrateLock) {
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(MIGRATE_LOCK)
                .execute(&mut *conn)
                .await?;
        }
        let result = migrate_locked(&mut conn, schema, self.partitions()).await;
        release(conn, result.is_ok(), self.session()).await;
        result
    }

    /// Refuses (`StoreError::Behind`) unless every migration is applied.
    pub async fn check_migrated(&self, schema: Option<&str>) -> Result<(), StoreError> {
        let pending = self.pending_migrations(schema).await?;
        if pending.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Behind { pending })
        }
    }

    /// Migrations of this build that the database has not applied.
    pub async fn pending_migrations(
        &self,
        schema: Option<&str>,
    ) -> Result<Vec<Pending>, StoreError> {
        let mut conn = self.pool().acquire().await?;
        pending_on(&mut conn, schema).await
    }
}

async fn migrate_locked(
    conn: &mut PgConnection,
    schema: Option<&str>,
    partitions: u32,
) -> Result<(), StoreError> {
    let pending = pending_on(conn, schema).await?;
    if pending.is_empty() {
        return Ok(());
    }
    // Read by 0005, which partitions the key table; for this session only.
    sqlx::query("SELECT set_config('dedupq.partitions', $1, false)")
        .bind(partitions.to_string())
        .execute(&mut *conn)
        .await?;
    if let Some(schema) = schema {
        // The name is a checked plain identifier (see connect_lazy).
        let sql = format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"");
        if let Err(e) = conn.execute(sql.as_str()).await {
            return Err(needs_owner(e, &pending));
        }
    }
    match MIGRATOR.run(&mut *conn).await {
        Ok(()) => Ok(()),
        Err(sqlx::migrate::MigrateError::Execute(e))
        | Err(sqlx::migrate::MigrateError::ExecuteMigration(e, _)) => Err(needs_owner(e, &pending)),
        Err(e) => Err(e.into()),
    }
}

/// A permission error while applying pending migrations says what to do.
fn needs_owner(e: sqlx::Error, pending: &[Pending]) -> StoreError {
    let denied =
        matches!(&e, sqlx::Error::Database(db) if db.code().as_deref() == Some(PERMISSION_DENIED));
    if denied {
        StoreError::NeedsOwner {
            pending: pending.to_vec(),
            source: e,
        }
    } else {
        e.into()
    }
}

/// Unlocks and returns the connection to the pool, its session put back
/// the way dedupq opens one (`session`: its `SET`s). After a failure, or
/// for a pool built elsewhere (no `SET`s known), the connection is closed
/// instead, which drops the lock whatever state the session is in.
async fn release(mut conn: PoolConnection<Postgres>, ok: bool, session: &str) {
    if ok && !session.is_empty() {
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATE_LOCK)
            .execute(&mut *conn)
            .await;
        let reset = format!("RESET dedupq.partitions; {session}");
        let reset = conn.execute(sqlx::raw_sql(&reset)).await;
        if unlocked.is_ok() && reset.is_ok() {
            return;
        }
    }
    let _ = conn.close().await;
}

async fn pending_on(
    conn: &mut PgConnection,
    schema: Option<&str>,
) -> Result<Vec<Pending>, StoreError> {
    let table = match schema {
        Some(schema) => format!("\"{schema}\"._sqlx_migrations"),
        None => "_sqlx_migrations".to_string(),
    };
    let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(&table)
        .fetch_one(&mut *conn)
        .await?;
    let applied: Vec<(i64, bool, Vec<u8>)> = match exists {
        Some(_) => {
            let sql = format!("SELECT version, success, checksum FROM {table}");
            sqlx::query_as(sql.as_str()).fetch_all(&mut *conn).await?
        }
        None => Vec::new(),
    };
    let applied: HashMap<i64, (bool, Vec<u8>)> = applied
        .into_iter()
        .map(|(v, ok, sum)| (v, (ok, sum)))
        .collect();
    let mut pending = Vec::new();
    for m in MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
    {
        match applied.get(&m.version) {
            None => pending.push(Pending {
                version: m.version,
                description: m.description.to_string(),
            }),
            Some((false, _)) => {
                return Err(StoreError::MigrationState(format!(
                "migration {} failed part-way earlier; repair it and delete its row from {table}",
                m.version
            )))
            }
            Some((true, sum)) if sum.as_slice() != m.checksum.as_ref() => {
                return Err(StoreError::MigrationState(format!(
                    "migration {} in the database differs from the one this build carries",
                    m.version
                )))
            }
            Some(_) => {}
        }
    }
    Ok(pending)
}

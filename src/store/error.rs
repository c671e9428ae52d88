//! What can go wrong against the key table, sorted by what the caller can
//! do about it: wait and retry (an outage, contention) or not.

/// Why a statement against the key table failed. [`StoreError::is_transient`]
/// tells the errors worth waiting out from the rest.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or went away: pause and retry.
    #[error("PostgreSQL is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// A concurrent transaction got in the way (deadlock, serialization):
    /// retrying the same statement is safe.
    #[error("PostgreSQL aborted the statement because of a concurrent writer")]
    Contention(#[source] sqlx::Error),
    /// PostgreSQL refused the statement for another reason (a value it
    /// cannot store). Not transient: the
    /// engine splits a refused batch into single rows, so only the message
    /// PostgreSQL cannot take is given up.
    #[error("a statement against the key table failed")]
    Query(#[source] sqlx::Error),
    /// Applying the migrations failed other than for want of privileges
    /// (see `NeedsOwner`). Not retried: start-up or `dedupq migrate` stops.
    #[error("applying the schema migrations failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A row holds what dedupq never writes (a status outside the four, a
    /// claimed row that was not asked for). Not retried.
    #[error("a stored key row is not what dedupq wrote: {0}")]
    Corrupt(String),
    /// `store.url` is not a PostgreSQL connection URL; found when the pool
    /// is built. Not retried: start-up stops.
    #[error("store.url is not a PostgreSQL connection URL")]
    Url(#[source] sqlx::Error),
    /// `store.schema` cannot go into the connection's `search_path` as a
    /// plain quoted identifier; found when the pool is built.
    #[error("store.schema {name:?} is refused: {problem}")]
    SchemaName {
        /// The configured schema name.
        name: String,
        /// Why it is refused.
        problem: String,
    },
    #[error(
        "the key table's schema is behind this build: not applied: {}. Run `dedupq migrate` \
         with the schema owner's role first (store.migrate = \"check\" never changes the schema)",
        super::schema::list(pending)
    )]
    /// `store.migrate = "check"` found migrations of this build that the
    /// database has not applied. Start-up stops until `dedupq migrate` runs.
    Behind {
        /// The missing migrations, in version order.
        pending: Vec<super::schema::Pending>,
    },
    #[error(
        "migrations are pending ({}) and this database role may not apply them. Run `dedupq \
         migrate` with the schema owner's role, and start with store.migrate = \"check\"",
        super::schema::list(pending)
    )]
    /// Migrations are pending and this role may not apply them
    /// (PostgreSQL's insufficient_privilege). Not retried.
    NeedsOwner {
        /// The migrations it could not apply, in version order.
        pending: Vec<super::schema::Pending>,
        /// PostgreSQL's refusal.
        #[source]
        source: sqlx::Error,
    },
    /// The database's migration history disagrees with this build: a
    /// migration failed part-way earlier, or an applied one differs from the
    /// one carried here. Needs an operator; not retried.
    #[error("the migration history is inconsistent: {0}")]
    MigrationState(String),
}

impl StoreError {
    /// True when the same call may succeed later without any change.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Contention(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e),
            sqlx::Error::Database(db) => match db.code().as_deref() {
                // deadlock_detected, serialization_failure
                Some("40P01") | Some("40001") => StoreError::Contention(e),
                // admin_shutdown, crash_shutdown, cannot_connect_now, connection_* (08…)
                Some(code)
                    if code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03") =>
                {
                    StoreError::Unavailable(e)
                }
                _ => StoreError::Query(e),
            },
            _ => StoreError::Query(e),
        }
    }
}

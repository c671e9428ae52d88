#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or went away: pause and retry.
    #[error("PostgreSQL is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// A concurrent transaction got in the way (deadlock, serialization):
    /// retrying the same statement is safe.
    #[error("PostgreSQL aborted the statement because of a concurrent writer")]
    Contention(#[source] sqlx::Error),
    #[error("a statement against the key table failed")]
    Query(#[source] sqlx::Error),
    #[error("applying the schema migrations failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("a stored key row is not what dedupq wrote: {0}")]
    Corrupt(String),
    #[error("store.schema {name:?} is refused: {problem}")]
    SchemaName { name: String, problem: String },
    #[error(
        "the key table's schema is behind this build: not applied: {}. Run `dedupq migrate` \
         with the schema owner's role first (store.migrate = \"check\" never changes the schema)",
        super::schema::list(pending)
    )]
    Behind {
        pending: Vec<super::schema::Pending>,
    },
    #[error(
        "migrations are pending ({}) and this database role may not apply them. Run `dedupq \
         migrate` with the schema owner's role, and start with store.migrate = \"check\"",
        super::schema::list(pending)
    )]
    NeedsOwner {
        pending: Vec<super::schema::Pending>,
        #[source]
        source: sqlx::Error,
    },
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

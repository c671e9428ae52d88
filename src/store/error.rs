//! What can go wrong against the key table, sorted by what the caller can
//! do about it: wait and retry (an outage, contention) or not.

/// Why a statement against the key table failed. [`StoreError::is_transient`]
/// tells the errors worth waiting out from the rest.
///
/// The rule is turned towards keeping money safe: only an error that
/// belongs to one row (a value PostgreSQL cannot store) is final for that
/// row. Everything else (a read-only server after a failover, a statement
/// or lock timeout, a full disk, too many connections, an internal error,
/// a code this build does not know) is an outage: wait, retry, commit
/// nothing.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or went away: pause and retry.
    #[error("PostgreSQL is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// PostgreSQL answered, but cannot do the work now: read-only (a
    /// standby, `default_transaction_read_only`, storage-full protection),
    /// a statement or lock timeout, out of disk, memory or connections, an
    /// internal error, or any SQLSTATE not known to belong to one row.
    /// Pause and retry, like `Unavailable`.
    #[error("PostgreSQL cannot take the statement now{}", sqlstate_suffix(.0))]
    Outage(#[source] sqlx::Error),
    /// The readiness probe found the server taking no writes
    /// (`transaction_read_only` is on), as every write would (25006).
    #[error("PostgreSQL takes no writes: transaction_read_only is on (SQLSTATE 25006)")]
    ReadOnly,
    /// A concurrent transaction got in the way (deadlock, serialization):
    /// retrying the same statement is safe.
    #[error("PostgreSQL aborted the statement because of a concurrent writer")]
    Contention(#[source] sqlx::Error),
    /// PostgreSQL refused a value of the statement itself: a data exception
    /// (class 22), an integrity violation (class 23) or a program limit
    /// (class 54). Final for the row: the engine splits a refused batch into
    /// single rows, so only the message PostgreSQL cannot take is given up.
    #[error("PostgreSQL refused a row{}", sqlstate_suffix(.0))]
    Rejected(#[source] sqlx::Error),
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
    /// `store.url` leads to a pooler that hands each transaction (or
    /// statement) to any server session, as PgBouncer's `pool_mode =
    /// transaction` does: dedupq's session settings, prepared statements
    /// and advisory locks would not hold. Not retried: start-up stops.
    #[error(
        "store.url leads to a pooler that shares PostgreSQL sessions between transactions \
         ({0}): dedupq's session settings (schema, lock_timeout, synchronous_commit), prepared \
         statements and advisory locks need a session of their own. Use session pooling \
         (PgBouncer: pool_mode = session) or connect to PostgreSQL directly"
    )]
    SharedSessions(String),
}

impl StoreError {
    /// True when the same call may succeed later without any change.
    pub fn is_transient(&self) -> bool {
        if crate::broken::is(crate::broken::Break::StoreFaultsFinal) {
            return false;
        }
        matches!(
            self,
            StoreError::Unavailable(_)
                | StoreError::Outage(_)
                | StoreError::ReadOnly
                | StoreError::Contention(_)
        )
    }

    /// PostgreSQL's SQLSTATE, when the server answered with one.
    pub fn sqlstate(&self) -> Option<String> {
        match self {
            StoreError::Unavailable(e)
            | StoreError::Outage(e)
            | StoreError::Contention(e)
            | StoreError::Rejected(e)
            | StoreError::NeedsOwner { source: e, .. } => code_of(e),
            StoreError::ReadOnly => Some(READ_ONLY.into()),
            _ => None,
        }
    }

    /// The `class` label of `dedupq_store_errors_total`: the SQLSTATE's
    /// class (`25` read-only, `57` timeouts, `53` resources, …), or what
    /// failed without one (`connection`, `pool`, `other`). Few values.
    pub fn class(&self) -> &'static str {
        if let Some(code) = self.sqlstate() {
            return sqlstate_class(&code);
        }
        match self {
            StoreError::Unavailable(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => "pool",
            StoreError::Unavailable(_) => "connection",
            _ => "other",
        }
    }

    /// A wait for a row lock ran out (`lock_not_available`), or the
    /// statement was cancelled by a timeout while it may have been waiting
    /// for one (`query_canceled`): the store looks for the rows another
    /// transaction holds and leaves only those behind.
    pub fn is_lock_wait(&self) -> bool {
        matches!(
            self.sqlstate().as_deref(),
            Some(LOCK_NOT_AVAILABLE | QUERY_CANCELED)
        )
    }

    /// The server takes no writes (`read_only_sql_transaction`): a standby
    /// after a failover, `default_transaction_read_only`, storage-full
    /// protection. The pool's connections are replaced, since a session
    /// stays read-only (or on the old primary) for as long as it lives.
    pub fn is_read_only(&self) -> bool {
        self.sqlstate().as_deref() == Some(READ_ONLY)
    }

    /// The statement never ran, so running it again on another connection
    /// is safe whatever it writes: PostgreSQL had ended the session for
    /// sitting idle before the statement arrived (`idle_session_timeout`,
    /// SQLSTATE 57P05), or the connection was already closed when the
    /// statement was written (a broken pipe: the server cannot have read
    /// it whole).
    pub fn never_ran(&self) -> bool {
        match self {
            StoreError::Unavailable(sqlx::Error::Io(io)) => {
                io.kind() == std::io::ErrorKind::BrokenPipe
            }
            e => e.sqlstate().as_deref() == Some(IDLE_SESSION_TIMEOUT),
        }
    }

    /// The statement's session is over: the server ended it (shut down,
    /// restarted, terminated it, or found it idle too long) or the
    /// connection broke. The pool's other connections that sat idle
    /// meanwhile may be gone as well.
    pub fn session_ended(&self) -> bool {
        match self {
            StoreError::Unavailable(sqlx::Error::Io(_) | sqlx::Error::Protocol(_)) => true,
            e => e.sqlstate().is_some_and(|c| session_over(&c)),
        }
    }

    /// PostgreSQL refused to let the configured role in: SQLSTATE class 28
    /// (`invalid_password`, `invalid_authorization_specification`: no such
    /// role, no `pg_hba.conf` entry, peer authentication failed).
    pub fn is_credentials_refused(&self) -> bool {
        self.sqlstate()
            .is_some_and(|c| c.starts_with(INVALID_AUTHORIZATION))
    }
}

/// The class of `invalid_authorization_specification` and `invalid_password`.
const INVALID_AUTHORIZATION: &str = "28";

/// `read_only_sql_transaction`.
const READ_ONLY: &str = "25006";
/// `idle_session_timeout`: the server ended a session that sat idle.
const IDLE_SESSION_TIMEOUT: &str = "57P05";

/// The SQLSTATEs of a session the server ended: admin_shutdown (a restart,
/// `pg_terminate_backend`), crash_shutdown, idle_session_timeout, and the
/// connection exceptions (08…).
fn session_over(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | IDLE_SESSION_TIMEOUT)
}
/// `lock_not_available`: `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// `query_canceled`: `statement_timeout` ran out (or a cancel request).
const QUERY_CANCELED: &str = "57014";

fn code_of(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

fn sqlstate_suffix(e: &sqlx::Error) -> String {
    code_of(e).map_or_else(String::new, |c| format!(" (SQLSTATE {c})"))
}

/// The label of a SQLSTATE's class. Known classes by name, so the label
/// set stays small whatever a server answers.
/// Every value of the `class` label of `dedupq_store_errors_total`, so
/// each series exists (at zero) from start-up and a rate over it is
/// defined before the first error.
pub const STORE_ERROR_CLASSES: &[&str] = &[
    "08",
    "22",
    "23",
    "25",
    "40",
    "42",
    "53",
    "54",
    "55",
    "57",
    "58",
    "XX",
    "connection",
    "pool",
    "other",
];

fn sqlstate_class(code: &str) -> &'static str {
    match code.get(..2) {
        Some("08") => "08",
        Some("22") => "22",
        Some("23") => "23",
        Some("25") => "25",
        Some("40") => "40",
        Some("42") => "42",
        Some("53") => "53",
        Some("54") => "54",
        Some("55") => "55",
        Some("57") => "57",
        Some("58") => "58",
        Some("XX") => "XX",
        _ => "other",
    }
}

/// The classes whose errors belong to the row a statement tried to
/// write, not to the server: data exceptions, integrity violations,
/// program limits.
fn belongs_to_the_row(code: &str) -> bool {
    matches!(code.get(..2), Some("22" | "23" | "54"))
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e),
            sqlx::Error::Database(db) => match db.code().as_deref() {
                // deadlock_detected, serialization_failure, and a unique
                // violation (a racing insert of the same key): the same
                // statement may be run again.
                Some("40P01") | Some("40001") | Some("23505") => StoreError::Contention(e),
                // A session the server ended, or cannot_connect_now (a
                // server starting up or shutting down).
                Some(code) if session_over(code) || code == "57P03" => StoreError::Unavailable(e),
                Some(code) if belongs_to_the_row(code) => StoreError::Rejected(e),
                // Read-only, timeouts, resources, internal errors, and any
                // code not known: never final for a payment.
                _ => StoreError::Outage(e),
            },
            // Anything else (a column that does not decode, a type the
            // server does not know) says nothing about one row either.
            _ => StoreError::Outage(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connection_closed_before_the_statement_was_written_proves_it_never_ran() {
        let io = |kind| StoreError::from(sqlx::Error::Io(std::io::Error::from(kind)));
        let pipe = io(std::io::ErrorKind::BrokenPipe);
        assert!(pipe.never_ran() && pipe.session_ended());
        for kind in [
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            // The server may have run (and committed) it before the
            // connection broke: ended, but not known to be unrun.
            let e = io(kind);
            assert!(!e.never_ran() && e.session_ended(), "{kind:?}");
        }
        let timed_out = StoreError::from(sqlx::Error::PoolTimedOut);
        assert!(!timed_out.never_ran() && !timed_out.session_ended());
        assert!(!StoreError::ReadOnly.never_ran());
    }

    #[test]
    fn every_class_a_code_can_get_is_initialised() {
        for code in [
            "08006", "22001", "23505", "25006", "40001", "42P01", "53100", "54000", "55P03",
            "57014", "58030", "XX000", "0A000", "ZZ999",
        ] {
            let class = sqlstate_class(code);
            assert!(STORE_ERROR_CLASSES.contains(&class), "{code} -> {class}");
        }
    }

    #[test]
    fn only_errors_of_a_row_are_final_and_every_other_code_is_an_outage() {
        for code in ["22P05", "22001", "23502", "23514", "54000"] {
            assert!(belongs_to_the_row(code), "{code}");
        }
        for code in [
            "25006", "57014", "55P03", "40003", "53100", "53200", "53300", "58030", "XX000",
            "42P01", "0A000", "ZZ999",
        ] {
            assert!(!belongs_to_the_row(code), "{code}");
        }
        assert_eq!(sqlstate_class("25006"), "25");
        assert_eq!(sqlstate_class("ZZ999"), "other");
        assert_eq!(sqlstate_class("X"), "other");
    }
}

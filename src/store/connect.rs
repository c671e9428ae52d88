//! The connection pool behind [`Store`]: built lazily, sized for batched
//! statements, and failing fast while PostgreSQL is down.

use super::StoreError;
use crate::config::{check_schema_name, StoreSettings};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::query::Query;
use sqlx::{Executor, PgPool, Postgres, Row};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, SemaphorePermit};

/// How PostgreSQL plans dedupq's statements, set on each of its
/// connections. Every statement of the hot path reaches rows by key, a
/// batch of at most `engine.max_batch` of them, so probing the primary key
/// once per key is always the cheapest plan, and it reaches one partition
/// per key. The planner cannot see how long an array parameter is (it
/// assumes 100 elements), so on a table of a few thousand rows it would
/// hash the batch and scan every partition whole (measured with EXPLAIN
/// ANALYZE: a finish of 17 keys at 20 000 stored keys took 15 ms that
/// way and 1 ms by key); hash and merge joins are therefore off. Sequential
/// scans are off too: before autovacuum has analysed a young partition its
/// statistics say it is nearly empty, and the planner then reads every
/// partition whole once per statement and matches the batch against it
/// (measured: the same finish took 53 ms so, on an unanalysed table).
/// A transactional handler's own statements, and the few reads that scan
/// the table on purpose, get the defaults back ([`default_planner_sql`]).
const PLANNER: [(&str, &str); 3] = [
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("enable_seqscan", "off"),
];

/// `PLANNER` undone: PostgreSQL's own planning (each of these is on by
/// default), for a transactional handler's SQL, the reads that scan the
/// whole table, and the migrations. `local`: for the current transaction
/// only; otherwise for the session, until [`planner_reset_sql`].
pub(super) fn default_planner_sql(local: bool) -> &'static str {
    static LOCAL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static SESSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let (sql, scope) = if local {
        (&LOCAL, "LOCAL ")
    } else {
        (&SESSION, "")
    };
    sql.get_or_init(|| {
        PLANNER
            .iter()
            .map(|(name, _)| format!("SET {scope}{name} = on; "))
            .collect()
    })
}

/// The `SET`s each of dedupq's sessions starts with, run as one simple
/// query the moment a connection opens (not as startup parameters, which
/// a pooler such as PgBouncer refuses, or drops when told to ignore them):
/// the schema, the row-lock wait, the planning of [`PLANNER`], and the
/// commit's durability.
fn session_sql(settings: &StoreSettings) -> Result<String, StoreError> {
    let mut sql = String::new();
    if let Some(schema) = &settings.schema {
        // Checked here too, for callers that skip the configuration's
        // validation: the name is written into the statement. Quoted, so
        // its case is kept.
        check_schema_name(schema).map_err(|problem| StoreError::SchemaName {
            name: schema.clone(),
            problem,
        })?;
        sql.push_str(&format!("SET search_path = \"{schema}\"; "));
    }
    // Each statement waits this long for a row lock, then fails with
    // lock_not_available, and the store leaves only the rows another
    // transaction holds behind: a row locked from psql holds back its own
    // key, never the batch, its partition or the pool.
    sql.push_str(&format!(
        "SET lock_timeout = '{}ms'; ",
        settings.lock_timeout.as_millis().max(1)
    ));
    for (name, value) in PLANNER {
        sql.push_str(&format!("SET {name} = {value}; "));
    }
    // Set here, so no default of the server, the database or the role
    // (`ALTER ROLE … SET synchronous_commit = off`) decides whether an
    // acknowledged commit of dedupq's survives a crash or a failover.
    sql.push_str(&format!(
        "SET synchronous_commit = {}; ",
        settings.synchronous_commit.as_str()
    ));
    Ok(sql)
}

/// A handle on the key table. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: PgPool,
    guard: Arc<Guard>,
    /// The `SET`s each of dedupq's sessions starts with (see
    /// [`session_sql`]); empty for a pool built elsewhere.
    session: Arc<str>,
    /// How many partitions a migration that creates the key table's gives
    /// it (`store.partitions`).
    partitions: u32,
}

/// What keeps the pool useful while PostgreSQL misbehaves.
#[derive(Debug)]
struct Guard {
    /// Claims take one of these for their statement: the pool's other
    /// connections stay free for lease renewals and finishes, so claims
    /// that wait (on a row lock, a slow server) can never take the
    /// connection a charged payment needs to store its answer.
    claims: Semaphore,
    /// How many claim statements may run at once.
    claim_lanes: usize,
    /// How long a statement waits for its answer (`store.statement_deadline`).
    deadline: Duration,
    /// When a statement last met a read-only server: connections opened
    /// before then are closed instead of reused, since a session stays on
    /// a standby (or read-only) for as long as it lives.
    read_only_since: Mutex<Option<Instant>>,
    /// When a statement last found its session over (the server restarted
    /// or ended an idle session, the connection broke): connections idle
    /// since before then may be over too, and are closed instead of
    /// reused. Those used after it have shown they are alive.
    ended_since: Mutex<Option<Instant>>,
}

impl Guard {
    fn new(max_connections: u32, deadline: Duration) -> Arc<Self> {
        // A quarter of the pool (at least one connection) is kept from
        // claims; a pool of one shares its connection.
        let max = max_connections.max(1) as usize;
        let reserved = if max >= 2 { (max / 4).max(1) } else { 0 };
        Arc::new(Self {
            claims: Semaphore::new(max - reserved),
            claim_lanes: max - reserved,
            deadline,
            read_only_since: Mutex::new(None),
            ended_since: Mutex::new(None),
        })
    }

    /// Whether a connection of this age was opened after the last
    /// read-only answer (or there was none).
    fn still_good(&self, age: Duration) -> bool {
        let since = *self
            .read_only_since
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        since.is_none_or(|t| age < t.elapsed())
    }

    /// Whether a connection idle for `idle_for` was used after the last
    /// session found over (or there was none).
    fn used_since_an_end(&self, idle_for: Duration) -> bool {
        let since = *self.ended_since.lock().unwrap_or_else(|e| e.into_inner());
        since.is_none_or(|t| idle_for < t.elapsed())
    }
}

/// A pooled connection older than this is closed instead of reused
/// (sqlx's default lifetime, checked by dedupq itself).
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

impl Store {
    /// Builds the pool without touching the network, so a process can start
    /// (and report not-ready) while PostgreSQL is still down.
    pub fn connect_lazy(settings: &StoreSettings) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(settings.url.expose())
            .map_err(StoreError::Url)?
            .application_name("dedupq")
            // Not sent: a pooler in front of PostgreSQL (PgBouncer before
            // 1.20) refuses a startup parameter it does not know, and
            // dedupq reads no floats as text.
            .extra_float_digits(None);
        let session: Arc<str> = session_sql(settings)?.into();
        let after = session.clone();
        let guard = Guard::new(settings.max_connections, settings.statement_deadline);
        let fresh = guard.clone();
        let idle_timeout = settings.idle_timeout;
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
            // After a read-only answer, connections opened before it are
            // replaced: a failover's new primary is found by reconnecting.
            // After a session found over, those idle since then are: the
            // server's restart or idle_session_timeout ended them all, and
            // each would fail one statement otherwise. One idle past
            // store.idle_timeout is too: a middlebox may have forgotten its
            // flow, and a statement sent over it would wait for the
            // kernel's retransmission timeout. So is one older than
            // MAX_LIFETIME. A check of their age and idle time only, no
            // round trip.
            //
            // sqlx's own idle timeout and lifetime stay off: its reaper
            // takes every idle connection it does not close and puts it
            // back as if just used, so the idle time this check reads
            // would never pass the reaper's period, and a connection idle
            // for an hour would be used over a flow forgotten long ago.
            .idle_timeout(None)
            .max_lifetime(None)
            .before_acquire(move |_, meta| {
                let keep = fresh.still_good(meta.age)
                    && fresh.used_since_an_end(meta.idle_for)
                    && meta.idle_for < idle_timeout
                    && meta.age < MAX_LIFETIME;
                Box::pin(async move { Ok(keep) })
            })
            // One round trip per new connection, in its first moment.
            .after_connect(move |conn, _| {
                let sql = after.clone();
                Box::pin(async move { conn.execute(sqlx::raw_sql(&sql)).await.map(|_| ()) })
            })
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            guard,
            session,
            partitions: settings.partitions,
        })
    }

    /// A store over a pool built elsewhere, taken as it is (none of the
    /// settings `connect_lazy` applies to its connections; the claims
    /// still leave a quarter of them free, and a statement still waits
    /// at most the default `store.statement_deadline` for its answer).
    pub fn from_pool(pool: PgPool) -> Self {
        let guard = Guard::new(
            pool.options().get_max_connections(),
            StoreSettings::default().statement_deadline,
        );
        Self {
            pool,
            guard,
            session: "".into(),
            partitions: StoreSettings::default().partitions,
        }
    }

    /// The same store, migrating to `partitions` partitions of the key
    /// table (see `store.partitions`).
    pub fn with_partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    /// How many partitions a migration creating the partitioned key table
    /// gives it.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// How many claim statements may run at once: the pool's connections
    /// less those kept for renewals and finishes.
    pub fn claim_lanes(&self) -> usize {
        self.guard.claim_lanes
    }

    /// A claim statement's share of the pool (see [`Guard`]).
    pub(super) async fn claim_permit(&self) -> SemaphorePermit<'_> {
        // Never closed, so acquiring cannot fail.
        self.guard
            .claims
            .acquire()
            .await
            .expect("the claim semaphore is never closed")
    }

    /// Notes an error met by a statement: after a read-only answer, the
    /// pool's connections are replaced as they are next taken; after a
    /// session found over, those that sat idle since.
    pub(super) fn saw(&self, e: &StoreError) {
        let mark = |at: &Mutex<Option<Instant>>| {
            *at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        };
        if e.is_read_only() {
            mark(&self.guard.read_only_since);
        }
        if e.session_ended() {
            mark(&self.guard.ended_since);
        }
    }

    /// Passes a statement's error on, after noting what it says about the
    /// server (a read-only one has its connections replaced).
    pub(super) fn noted(&self, e: sqlx::Error) -> StoreError {
        let e = StoreError::from(e);
        self.saw(&e);
        e
    }

    /// Runs the statement `query` builds, and runs it once more if it
    /// never ran because its connection's session had already ended
    /// ([`StoreError::never_ran`]): a session the server ended for sitting
    /// idle in the pool is not an outage, and a request must not be
    /// refused for it. The second run takes another connection (the idle
    /// ones of that moment are replaced, see [`Store::saw`]).
    pub(super) async fn rows<'q>(
        &self,
        query: impl Fn() -> Query<'q, Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>, StoreError> {
        match self.answered(query()).await {
            Err(e) if e.never_ran() => {
                tracing::debug!(error = %e, "the session had ended before the statement; running it again");
                self.answered(query()).await
            }
            done => done,
        }
    }

    /// Runs one statement, waiting at most `store.statement_deadline` for
    /// its answer. Past it the connection is dropped (not returned to the
    /// pool, whose check of it would wait as long) and the statement fails
    /// as if the connection had broken: it may or may not have run.
    async fn answered<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.noted(e))?;
        match tokio::time::timeout(self.guard.deadline, query.fetch_all(&mut *conn)).await {
            Ok(answer) => answer.map_err(|e| self.noted(e)),
            Err(_) => {
                drop(conn.detach());
                let gone = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no answer from PostgreSQL within store.statement_deadline ({}); \
                         the connection was dropped",
                        humantime::format_duration(self.guard.deadline)
                    ),
                );
                Err(self.noted(sqlx::Error::Io(gone)))
            }
        }
    }

    /// The pool itself, for statements outside this module (the scenario
    /// checks, the benchmarks and the tests read the key table directly).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The `SET`s each of dedupq's sessions starts with; run again, they
    /// put a session back the way dedupq opened it.
    pub(super) fn session(&self) -> &str {
        &self.session
    }

    /// Why a new connection fails right now (None: it succeeds). The pool
    /// only reports that it timed out; this says what an operator can fix
    /// (refused, unknown host, TLS, authentication).
    async fn connect_error(&self) -> Option<sqlx::Error> {
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

    /// `e` with the reason behind a pool timeout: a pool that times out
    /// says only that, so a connection opened outside it (and closed at
    /// once) says why: too many connections for the role or the server
    /// (53300), refused, authentication. If that connection opens, the
    /// pool was only busy, and the timeout is `e` as it was; any other
    /// error is its own reason.
    pub async fn explained(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Unavailable(sqlx::Error::PoolTimedOut) => {
                self.connect_error().await.map_or(e, StoreError::from)
            }
            e => e,
        }
    }

    /// Can PostgreSQL take dedupq's writes right now? Reachable is not
    /// enough: a standby after a failover, or a database or role set
    /// `default_transaction_read_only`, answers reads and refuses every
    /// claim. Such a server is reported as the error a write would meet
    /// (SQLSTATE 25006), and the pool replaces its connections.
    ///
    /// A pool that times out is [explained](Self::explained), so `/readyz`
    /// names what an operator can fix.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let rows = self
            .rows(|| sqlx::query("SELECT current_setting('transaction_read_only')"))
            .await;
        let read_only: String = match rows {
            Ok(rows) => match rows.first() {
                Some(row) => row.try_get(0)?,
                None => return Err(sqlx::Error::RowNotFound.into()),
            },
            Err(e) => return Err(self.explained(e).await),
        };
        if read_only == "on" {
            let e = StoreError::ReadOnly;
            self.saw(&e);
            return Err(e);
        }
        Ok(())
    }
}

//! A PostgreSQL that misbehaves for one test only: a login role of its
//! own, which the test turns read-only (as after a failover to a standby),
//! gives a statement timeout, refuses new sessions, or cuts off; the
//! test's schema on a disk that fills up; its key table or one of its rows
//! locked from another session. Other tests, on other roles and schemas,
//! never notice.

use super::small_disk::SmallDisk;
use super::{database_url, unique};
use dedupq::config::{SecretUrl, StoreSettings};
use sqlx::{Executor, PgPool};

/// A fault of PostgreSQL's that a test begins while a charge's answer is
/// on its way, and ends later.
#[derive(Clone, Copy, Debug)]
pub enum StoreFault {
    /// Through the role dedupq logs in as.
    Role(RoleFault),
    /// The disk under the test's schema full (53100): every write that
    /// needs a new page fails.
    DiskFull,
    /// The key table locked for writes from another session, as a
    /// `CREATE INDEX` without `CONCURRENTLY` holds it (`SHARE`): writes
    /// wait, reads go on.
    TableLockedForWrites,
    /// The key table locked from another session as `VACUUM FULL`,
    /// `CLUSTER` or most `ALTER TABLE`s hold it (`ACCESS EXCLUSIVE`):
    /// reads wait too.
    TableLockedExclusively,
}

/// Bytes of the answers the fault tests' provider gives: more than a page,
/// so that storing one needs pages the key table does not have yet (and a
/// test can tell the answer was stored whole).
pub const LONG_ANSWER: usize = 16 * 1024;

/// A [`StoreFault`] set up on one test's store.
pub enum StagedFault {
    Role(FaultyRole, RoleFault),
    /// The disk, and the schema on it.
    Disk(SmallDisk, String),
    Table(TableLock),
}

impl StagedFault {
    /// Sets `fault` up for the (migrated) schema of `settings`. dedupq is
    /// to use [`Self::store_settings`].
    pub async fn stage(fault: StoreFault, settings: &StoreSettings) -> Self {
        match fault {
            StoreFault::Role(fault) => StagedFault::Role(FaultyRole::create().await, fault),
            StoreFault::DiskFull => {
                let schema = settings.schema.clone().expect("a schema of the test's own");
                let disk = SmallDisk::mount(16).await;
                disk.take(&schema).await;
                StagedFault::Disk(disk, schema)
            }
            StoreFault::TableLockedForWrites | StoreFault::TableLockedExclusively => {
                let schema = settings
                    .schema
                    .as_deref()
                    .expect("a schema of the test's own");
                let exclusive = matches!(fault, StoreFault::TableLockedExclusively);
                StagedFault::Table(TableLock::new(schema, exclusive).await)
            }
        }
    }

    /// `settings` as dedupq is to use them: through the faulty role, if
    /// the fault is the role's.
    pub fn store_settings(&self, settings: &StoreSettings) -> StoreSettings {
        match self {
            StagedFault::Role(role, _) => role.store_settings(settings),
            StagedFault::Disk(..) | StagedFault::Table(_) => settings.clone(),
        }
    }

    pub async fn begin(&self) {
        match self {
            StagedFault::Role(role, fault) => role.begin(*fault).await,
            StagedFault::Disk(disk, _) => disk.fill(),
            StagedFault::Table(lock) => lock.take().await,
        }
    }

    /// The fault ends (for new sessions, if it is the role's).
    pub async fn end(&self) {
        match self {
            StagedFault::Role(role, fault) => role.end(*fault).await,
            StagedFault::Disk(disk, _) => disk.free(),
            StagedFault::Table(lock) => lock.release().await,
        }
    }

    /// What `/readyz` names while the fault lasts; None: it stays ready
    /// (a lock is no outage: each key waits for its row, as for a row
    /// lock, and the waits are counted).
    pub fn named_as(&self) -> Option<&'static [&'static str]> {
        match self {
            StagedFault::Role(_, fault) => Some(fault.named_as()),
            StagedFault::Disk(..) => Some(&["53100"]),
            // Reads wait as well: the rows held cannot be looked for.
            StagedFault::Table(lock) if lock.exclusive => Some(&["55P03"]),
            StagedFault::Table(_) => None,
        }
    }

    /// The metric (name and labels) that counts the fault's failed
    /// statements: `dedupq_store_errors_total` by SQLSTATE class; lock
    /// waits as the claims they leave behind.
    pub fn counted_as(&self) -> String {
        let class = match self {
            StagedFault::Role(_, fault) => fault.error_class(),
            StagedFault::Disk(..) => "53",
            StagedFault::Table(lock) if lock.exclusive => "55",
            StagedFault::Table(_) => return r#"dedupq_claims_total{result="locked"}"#.into(),
        };
        format!(r#"dedupq_store_errors_total{{class="{class}"}}"#)
    }

    /// Asserts that the fault still holds where dedupq could have undone
    /// it: no session of a role kept out was let in.
    pub async fn still_holds(&self) {
        if let StagedFault::Role(role, RoleFault::NoConnections) = self {
            assert_eq!(role.sessions().await, 0, "no session of the role let in");
        }
    }

    /// Whether a claim of a new key fails while the fault lasts. A claim
    /// may still find room on the key table's last page when its disk is
    /// full, and its payment then runs; only its outcome waits for room.
    pub fn refuses_claims(&self) -> bool {
        matches!(self, StagedFault::Role(..) | StagedFault::Table(_))
    }

    /// `key`'s status, read by the test while the fault lasts: through the
    /// session that holds an exclusive table lock (no other can read the
    /// table), else as usual.
    pub async fn status(&self, store: &PgPool, tenant: &str, key: &str) -> Option<String> {
        if let StagedFault::Table(lock) = self {
            if let Some(tx) = lock.tx.lock().await.as_mut() {
                return read_status(&mut **tx, tenant, key).await;
            }
        }
        read_status(store, tenant, key).await
    }

    /// Drops the role, or the schema and the disk (after dedupq is gone).
    pub async fn remove(self) {
        match self {
            StagedFault::Role(role, _) => role.drop().await,
            StagedFault::Disk(disk, schema) => disk.remove(&schema).await,
            StagedFault::Table(lock) => lock.release().await,
        }
    }
}

/// A fault that takes every session of a [`FaultyRole`] away at once.
#[derive(Clone, Copy, Debug)]
pub enum RoleFault {
    /// A failover to a read-only server (25006).
    ReadOnly,
    /// Every session cut and none let in (53300).
    NoConnections,
}

impl RoleFault {
    /// What `/readyz` names while the fault lasts.
    pub fn named_as(self) -> &'static [&'static str] {
        match self {
            RoleFault::ReadOnly => &["25006"],
            RoleFault::NoConnections => &["53300", "too many connections"],
        }
    }

    /// The `class` label of `dedupq_store_errors_total` its errors get.
    pub fn error_class(self) -> &'static str {
        match self {
            RoleFault::ReadOnly => "25",
            // The pool times out; it has no SQLSTATE to count.
            RoleFault::NoConnections => "pool",
        }
    }
}

pub struct FaultyRole {
    pub name: String,
    password: String,
    admin: PgPool,
}

impl FaultyRole {
    /// A superuser role (it needs no grants on the test's schema; a
    /// superuser still obeys `default_transaction_read_only` and
    /// `statement_timeout`).
    pub async fn create() -> Self {
        let admin = PgPool::connect(&database_url()).await.expect("admin pool");
        let (name, password) = (unique("dq_faulty"), unique("pw"));
        admin
            .execute(format!("CREATE ROLE {name} LOGIN SUPERUSER PASSWORD '{password}'").as_str())
            .await
            .expect("create role");
        Self {
            name,
            password,
            admin,
        }
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:5432/postgres",
            self.name, self.password
        )
    }

    /// `settings` pointed at this role.
    pub fn store_settings(&self, settings: &StoreSettings) -> StoreSettings {
        StoreSettings {
            url: SecretUrl::new(self.url()),
            ..settings.clone()
        }
    }

    /// As a failover to a standby looks to a client: every session of the
    /// role is cut, and the new ones take no writes (SQLSTATE 25006).
    pub async fn fail_over_to_read_only(&self) {
        self.set("default_transaction_read_only", Some("on")).await;
        self.cut_sessions().await;
    }

    /// The database takes writes again, for new sessions only: sessions
    /// opened while it was read-only stay read-only until the client
    /// replaces them (as sessions on a demoted primary would).
    pub async fn writable_again(&self) {
        self.set("default_transaction_read_only", None).await;
    }

    /// `statement_timeout` for the role's new sessions (None: off), and
    /// the current sessions cut so that the new value applies at once.
    pub async fn statement_timeout(&self, ms: Option<u64>) {
        let value = ms.map(|ms| format!("{ms}"));
        self.set("statement_timeout", value.as_deref()).await;
        self.cut_sessions().await;
    }

    /// As a server out of connection slots looks to a client: every
    /// session of the role is cut, and new ones are refused with
    /// `too many connections for role` (SQLSTATE 53300). A role's
    /// connection limit binds no superuser, so the role stops being one
    /// until [`Self::accept_sessions_again`].
    pub async fn refuse_new_sessions(&self) {
        self.alter("NOSUPERUSER CONNECTION LIMIT 0").await;
        self.cut_sessions().await;
    }

    /// New sessions are let in again, as before.
    pub async fn accept_sessions_again(&self) {
        self.alter("SUPERUSER CONNECTION LIMIT -1").await;
    }

    /// `fault` begins.
    pub async fn begin(&self, fault: RoleFault) {
        match fault {
            RoleFault::ReadOnly => self.fail_over_to_read_only().await,
            RoleFault::NoConnections => self.refuse_new_sessions().await,
        }
    }

    /// `fault` ends (for new sessions).
    pub async fn end(&self, fault: RoleFault) {
        match fault {
            RoleFault::ReadOnly => self.writable_again().await,
            RoleFault::NoConnections => self.accept_sessions_again().await,
        }
    }

    async fn alter(&self, options: &str) {
        let sql = format!("ALTER ROLE {} {options}", self.name);
        self.admin.execute(sql.as_str()).await.expect("alter role");
    }

    /// The role's default for `setting` in its new sessions (None: reset),
    /// as `ALTER ROLE … SET` gives it.
    pub async fn set(&self, setting: &str, value: Option<&str>) {
        let sql = match value {
            Some(v) => format!("ALTER ROLE {} SET {setting} = '{v}'", self.name),
            None => format!("ALTER ROLE {} RESET {setting}", self.name),
        };
        self.admin.execute(sql.as_str()).await.expect("alter role");
    }

    /// Terminates every session of the role.
    pub async fn cut_sessions(&self) {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1")
            .bind(&self.name)
            .execute(&self.admin)
            .await
            .expect("terminate the role's sessions");
    }

    /// Sessions of the role now.
    pub async fn sessions(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE usename = $1")
            .bind(&self.name)
            .fetch_one(&self.admin)
            .await
            .expect("count sessions")
    }

    pub async fn drop(self) {
        self.set("default_transaction_read_only", None).await;
        self.cut_sessions().await;
        // Sessions may take a moment to end; a role with sessions cannot go.
        for _ in 0..50 {
            let dropped = self
                .admin
                .execute(format!("DROP ROLE IF EXISTS {}", self.name).as_str())
                .await;
            if dropped.is_ok() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// A key's status (None: no row), read through `db`.
pub async fn read_status<'c>(
    db: impl sqlx::Executor<'c, Database = sqlx::Postgres>,
    tenant: &str,
    key: &str,
) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM dedupq_keys WHERE tenant = $1 AND key = $2")
        .bind(tenant)
        .bind(key)
        .fetch_optional(db)
        .await
        .expect("read the key's status")
}

/// `key` was charged once by `provider`, and its stored outcome is that
/// charge's answer (201), whole: the answer given during a fault, kept
/// through it, not a later call's.
pub async fn charged_once_and_stored_whole(
    store: &dedupq::store::Store,
    provider: &super::process::Provider,
    tenant: &str,
    key: &str,
) {
    let charges = provider.charges_for(&format!("{tenant}:{key}")).await;
    assert_eq!(charges.len(), 1, "{key}: one charge");
    let (result, body): (i32, Vec<u8>) = sqlx::query_as(
        "SELECT result_status, result_body FROM dedupq_keys WHERE tenant = $1 AND key = $2",
    )
    .bind(tenant)
    .bind(key)
    .fetch_one(store.pool())
    .await
    .expect("the stored outcome");
    assert_eq!(result, 201, "{key}");
    let answer: serde_json::Value =
        serde_json::from_slice(&body).expect("the stored answer is the provider's JSON");
    assert_eq!(
        answer["id"],
        format!("ch_{}", charges[0].id),
        "{key}: the charge made"
    );
    assert_eq!(
        answer["receipt"].as_str().map(str::len),
        Some(LONG_ANSWER),
        "{key}: the answer stored whole"
    );
}

/// The key table locked from another session (on every partition), as
/// psql would hold it: for writes (`SHARE`, as `CREATE INDEX` without
/// `CONCURRENTLY`: reads go on), or exclusively (`ACCESS EXCLUSIVE`, as
/// `VACUUM FULL` or `ALTER TABLE`: reads wait too).
pub struct TableLock {
    pool: PgPool,
    schema: String,
    exclusive: bool,
    tx: tokio::sync::Mutex<Option<sqlx::Transaction<'static, sqlx::Postgres>>>,
}

impl TableLock {
    pub async fn new(schema: &str, exclusive: bool) -> Self {
        Self {
            pool: PgPool::connect(&database_url()).await.expect("lock pool"),
            schema: schema.to_string(),
            exclusive,
            tx: tokio::sync::Mutex::new(None),
        }
    }

    /// Takes the lock (once the transactions that hold the table end).
    pub async fn take(&self) {
        let mut tx = self.pool.begin().await.expect("begin");
        // The holder reads the schema's rows too (see StagedFault::status).
        let search_path = format!("SET LOCAL search_path TO \"{}\"", self.schema);
        tx.execute(search_path.as_str())
            .await
            .expect("set search_path");
        let mode = if self.exclusive {
            "ACCESS EXCLUSIVE"
        } else {
            "SHARE"
        };
        let sql = format!("LOCK TABLE dedupq_keys IN {mode} MODE");
        tx.execute(sql.as_str()).await.expect("lock the key table");
        *self.tx.lock().await = Some(tx);
    }

    pub async fn release(&self) {
        if let Some(tx) = self.tx.lock().await.take() {
            tx.rollback().await.expect("release the table lock");
        }
    }
}

/// A row lock held from another session, as an operator's `SELECT … FOR
/// UPDATE` in psql would, until released (or dropped).
pub struct RowLock {
    tx: Option<sqlx::Transaction<'static, sqlx::Postgres>>,
}

impl RowLock {
    /// Locks the key's row in `schema` (it must exist).
    pub async fn take(schema: &str, tenant: &str, key: &str) -> Self {
        let pool = PgPool::connect(&database_url()).await.expect("lock pool");
        let mut tx = pool.begin().await.expect("begin");
        let sql = format!(
            "SELECT 1 FROM \"{schema}\".dedupq_keys WHERE tenant = $1 AND key = $2 FOR UPDATE"
        );
        let locked: Option<i32> = sqlx::query_scalar(&sql)
            .bind(tenant)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await
            .expect("lock the row");
        assert!(locked.is_some(), "no row {tenant}/{key} to lock");
        Self { tx: Some(tx) }
    }

    /// How many sessions wait for this lock right now.
    pub async fn waiters(&mut self) -> i64 {
        let tx = self.tx.as_mut().expect("the lock is held");
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE pg_backend_pid() = ANY (pg_blocking_pids(pid))",
        )
        .fetch_one(&mut **tx)
        .await
        .expect("count the sessions waiting for the lock")
    }

    pub async fn release(mut self) {
        if let Some(tx) = self.tx.take() {
            tx.rollback().await.expect("release the row lock");
        }
    }
}

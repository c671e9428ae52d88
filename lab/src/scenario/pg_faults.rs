//! A PostgreSQL that misbehaves for one run only: the fleet logs in as a
//! role of its own, which the run turns read-only (a failover as clients
//! see it), refuses new sessions or gives a statement timeout; and row locks taken from the
//! run's own session. Other users of the server, on other roles, never
//! notice.

use sqlx::{Executor, PgPool, Postgres, Row, Transaction};
use std::future::Future;
use std::time::Duration;

/// Runs `op` again while it fails because the server went away (its
/// session ended by a shutdown, 57P01–57P03, or the connection lost), for
/// up to a minute: side by side, another run's fault may restart the
/// shared PostgreSQL under this run's own queries.
pub(super) async fn through_restarts<T, F, Fut>(mut op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match op().await {
            Err(e) if server_gone(&e) && tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "PostgreSQL went away under the run's own query; again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            done => return done,
        }
    }
}

fn server_gone(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| matches!(c.as_ref(), "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

/// The fleet's login role. A superuser: it needs no grants on the run's
/// schema, and still obeys `default_transaction_read_only` and
/// `statement_timeout`.
pub(super) struct RunRole {
    name: String,
    url: String,
    admin: PgPool,
}

impl RunRole {
    /// Creates `dedupq_chaos_<run id>` with a fresh password; `admin_url`
    /// is the run's own (administrator's) URL, whose host and database the
    /// role's URL keeps.
    pub(super) async fn create(admin_url: &str, run_id: &str) -> anyhow::Result<Self> {
        let name = format!("dedupq_chaos_{run_id}");
        let password = format!("{:032x}", rand::random::<u128>());
        let mut url = url::Url::parse(admin_url)?;
        url.set_username(&name)
            .and_then(|()| url.set_password(Some(&password)))
            .map_err(|()| anyhow::anyhow!("the store URL takes no user name"))?;
        let admin = PgPool::connect(admin_url).await?;
        admin
            .execute(format!("CREATE ROLE {name} LOGIN SUPERUSER PASSWORD '{password}'").as_str())
            .await?;
        Ok(Self {
            name,
            url: url.to_string(),
            admin,
        })
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The store URL the fleet connects with.
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// New sessions take no writes (SQLSTATE 25006) and every current one
    /// is cut: a failover to a standby, as a client sees it.
    pub(super) async fn read_only(&self) -> anyhow::Result<u64> {
        self.set("default_transaction_read_only", Some("on"))
            .await?;
        self.cut_sessions().await
    }

    /// Writable again for new sessions only: those opened while it was
    /// read-only stay read-only until the client replaces them (as
    /// sessions on a demoted primary would).
    pub(super) async fn writable(&self) -> anyhow::Result<()> {
        self.set("default_transaction_read_only", None).await
    }

    /// New sessions are refused (`too many connections for role`, SQLSTATE
    /// 53300) and every current one is cut. A role's connection limit binds
    /// no superuser, so the role stops being one until
    /// [`Self::accept_sessions`].
    pub(super) async fn refuse_sessions(&self) -> anyhow::Result<u64> {
        self.alter("NOSUPERUSER CONNECTION LIMIT 0").await?;
        self.cut_sessions().await
    }

    /// New sessions are let in again.
    pub(super) async fn accept_sessions(&self) -> anyhow::Result<()> {
        self.alter("SUPERUSER CONNECTION LIMIT -1").await
    }

    async fn alter(&self, options: &str) -> anyhow::Result<()> {
        let sql = format!("ALTER ROLE {} {options}", self.name);
        through_restarts(|| self.admin.execute(sql.as_str())).await?;
        Ok(())
    }

    /// `statement_timeout` for the role (None: off); current sessions are
    /// cut so that the change applies at once.
    pub(super) async fn statement_timeout(&self, timeout: Option<Duration>) -> anyhow::Result<u64> {
        let value = timeout.map(|t| format!("{}ms", t.as_millis()));
        self.set("statement_timeout", value.as_deref()).await?;
        self.cut_sessions().await
    }

    async fn set(&self, setting: &str, value: Option<&str>) -> anyhow::Result<()> {
        let sql = match value {
            Some(v) => format!("ALTER ROLE {} SET {setting} = '{v}'", self.name),
            None => format!("ALTER ROLE {} RESET {setting}", self.name),
        };
        through_restarts(|| self.admin.execute(sql.as_str())).await?;
        Ok(())
    }

    /// Terminates every session of the role; returns how many.
    async fn cut_sessions(&self) -> anyhow::Result<u64> {
        let cut: i64 = through_restarts(|| {
            sqlx::query_scalar(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) \
                 FROM pg_stat_activity WHERE usename = $1",
            )
            .bind(&self.name)
            .fetch_one(&self.admin)
        })
        .await?;
        Ok(cut as u64)
    }

    /// Drops the role (its settings reset, its sessions cut, anything it
    /// came to own handed to the administrator).
    pub(super) async fn drop(self) {
        let _ = self.accept_sessions().await;
        let _ = self.set("default_transaction_read_only", None).await;
        let _ = self.set("statement_timeout", None).await;
        let sql = format!(
            "REASSIGN OWNED BY {0} TO CURRENT_USER; DROP OWNED BY {0}; DROP ROLE IF EXISTS {0}",
            self.name
        );
        // A role with sessions cannot go, and cut sessions take a moment
        // to end.
        for _ in 0..50 {
            let _ = self.cut_sessions().await;
            match sqlx::raw_sql(&sql).execute(&self.admin).await {
                Ok(_) => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        tracing::warn!(role = %self.name, "could not drop the run's role");
    }
}

/// Row locks from a session other than dedupq's, as an operator's
/// `SELECT … FOR UPDATE` in psql would take them, until rolled back.
pub(super) struct RowLocks {
    tx: Transaction<'static, Postgres>,
    /// The locked rows, as `tenant:key (status)`.
    pub rows: Vec<String>,
}

impl RowLocks {
    /// Locks up to `each` rows of `schema.dedupq_keys` still in progress
    /// (their results wait) and as many just done (their duplicates'
    /// claims wait).
    pub(super) async fn take(pool: &PgPool, schema: &str, each: i64) -> anyhow::Result<Self> {
        Ok(through_restarts(|| Self::take_once(pool, schema, each)).await?)
    }

    async fn take_once(pool: &PgPool, schema: &str, each: i64) -> Result<Self, sqlx::Error> {
        let mut tx = pool.begin().await?;
        let mut rows = Vec::new();
        for (status, newest_first) in [("in_progress", "created_at"), ("done", "completed_at")] {
            let sql = format!(
                "SELECT tenant, key FROM \"{schema}\".dedupq_keys WHERE status = $1 \
                 ORDER BY {newest_first} DESC LIMIT $2 FOR UPDATE"
            );
            for r in sqlx::query(&sql)
                .bind(status)
                .bind(each)
                .fetch_all(&mut *tx)
                .await?
            {
                let (tenant, key): (String, String) = (r.get("tenant"), r.get("key"));
                rows.push(format!("{tenant}:{key} ({status})"));
            }
        }
        Ok(Self { tx, rows })
    }

    /// Rolls the locks back. A session the server ended has lost them
    /// already.
    pub(super) async fn release(self) -> anyhow::Result<()> {
        match self.tx.rollback().await {
            Err(e) if !server_gone(&e) => Err(e.into()),
            _ => Ok(()),
        }
    }
}

//! What `dedupq check` asks PostgreSQL before the first start: who we are
//! connected as, whether the server takes writes, and whether the role
//! holds the privileges the key table needs.

use super::{Store, StoreError};

/// The key table's tables, and the privileges a runtime role needs on each.
const NEEDED: &[(&str, &[&str])] = &[
    ("dedupq_keys", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("dedupq_key_audit", &["SELECT", "INSERT"]),
];

/// The server and the connected role, as one round trip of reads sees them.
#[derive(Debug, Clone)]
pub struct Server {
    /// `server_version`, e.g. `15.10 (Debian 15.10-0+deb12u1)`.
    pub version: String,
    /// The role dedupq is connected as.
    pub user: String,
    /// The database.
    pub database: String,
    /// `transaction_read_only`: a standby, or a database or role set
    /// `default_transaction_read_only`.
    pub read_only: bool,
    /// Connections the server accepts in all.
    pub max_connections: i64,
    /// Connections open on the server now.
    pub connections: i64,
    /// Slots only superusers may take (`superuser_reserved_connections`);
    /// 0 when the role is a superuser.
    pub reserved: i64,
    /// The role's own `CONNECTION LIMIT`; None when it has none (or is a
    /// superuser, whom it does not bind).
    pub role_limit: Option<i64>,
    /// Connections the role has open now, this one included.
    pub role_connections: i64,
    /// Whether TLS protects this connection.
    pub tls: bool,
}

/// A privilege the role lacks, or a table that is not there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// The table does not exist where the search_path looks (migrations
    /// not applied, or another `store.schema`).
    Table(&'static str),
    /// The role may not do this on the table.
    Privilege {
        /// The table.
        table: &'static str,
        /// `SELECT`, `INSERT`, `UPDATE` or `DELETE`.
        privilege: &'static str,
    },
}

impl Store {
    /// The server and role (see [`Server`]).
    pub async fn server(&self) -> Result<Server, StoreError> {
        type Row = (
            String,
            String,
            String,
            String,
            i64,
            i64,
            bool,
            i64,
            Option<i64>,
            i64,
        );
        let row: Row = sqlx::query_as(
            "SELECT current_setting('server_version'), current_user::text, \
             current_database()::text, current_setting('transaction_read_only'), \
             current_setting('max_connections')::bigint, \
             (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'), \
             COALESCE((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false), \
             CASE WHEN r.rolsuper THEN 0 \
                  ELSE current_setting('superuser_reserved_connections')::bigint END, \
             CASE WHEN r.rolsuper OR r.rolconnlimit < 0 THEN NULL \
                  ELSE r.rolconnlimit::bigint END, \
             (SELECT count(*) FROM pg_stat_activity \
               WHERE usename = current_user AND backend_type = 'client backend') \
             FROM pg_roles r WHERE r.rolname = current_user",
        )
        .fetch_one(self.pool())
        .await?;
        Ok(Server {
            version: row.0,
            user: row.1,
            database: row.2,
            read_only: row.3 == "on",
            max_connections: row.4,
            connections: row.5,
            tls: row.6,
            reserved: row.7,
            role_limit: row.8,
            role_connections: row.9,
        })
    }

    /// What the connected role lacks on the key table's tables; empty when
    /// every claim, finish, purge and tool statement may run.
    pub async fn missing_privileges(&self) -> Result<Vec<Missing>, StoreError> {
        let mut missing = Vec::new();
        for (table, privileges) in NEEDED {
            let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                .bind(table)
                .fetch_one(self.pool())
                .await?;
            if !exists {
                missing.push(Missing::Table(table));
                continue;
            }
            for privilege in privileges.iter() {
                let held: bool = sqlx::query_scalar("SELECT has_table_privilege($1, $2)")
                    .bind(table)
                    .bind(privilege)
                    .fetch_one(self.pool())
                    .await?;
                if !held {
                    missing.push(Missing::Privilege { table, privilege });
                }
            }
        }
        Ok(missing)
    }

    /// Whether the role may create the key table where `dedupq migrate`
    /// would (the schema, or the database if the schema does not exist
    /// yet; `public` by default).
    pub async fn may_create(&self, schema: Option<&str>) -> Result<bool, StoreError> {
        let sql = "SELECT CASE WHEN to_regnamespace($1) IS NULL \
                   THEN has_database_privilege(current_database(), 'CREATE') \
                   ELSE has_schema_privilege(to_regnamespace($1)::oid, 'CREATE') END";
        // Quoted: a configured schema keeps its case (see connect_lazy).
        let schema = match schema {
            Some(s) => format!("\"{s}\""),
            None => {
                sqlx::query_scalar("SELECT quote_ident(COALESCE(current_schema(), 'public'))")
                    .fetch_one(self.pool())
                    .await?
            }
        };
        Ok(sqlx::query_scalar(sql)
            .bind(schema)
            .fetch_one(self.pool())
            .await?)
    }
}

impl Store {
    /// Whether each of dedupq's connections keeps one PostgreSQL session
    /// from transaction to transaction, as a direct connection or a pooler
    /// in session mode does; Err([`StoreError::SharedSessions`]) when a
    /// pooler shares sessions (PgBouncer's transaction or statement mode).
    ///
    /// Three rounds: a pooled connection reads its backend, a second
    /// connection of its own opens a transaction and reads its backend,
    /// the first reads its backend again, and the second ends its
    /// transaction. In session mode the first connection's backend is one
    /// and the same throughout, and never the second's. A pooler in
    /// transaction mode gives the second connection the server session
    /// the first one just freed (PgBouncer reuses the last one freed), or
    /// the first one another session when it asks again. Each answer is
    /// read to its end (ReadyForQuery), so that the pooler has freed the
    /// session before the next statement is sent; simple queries only,
    /// since a prepared statement could land on another session than the
    /// one it was prepared on.
    pub async fn check_sessions_kept(&self) -> Result<(), StoreError> {
        use sqlx::{Connection, Executor};
        async fn run<'c, E: Executor<'c, Database = sqlx::Postgres>>(
            e: E,
            sql: &str,
        ) -> Result<Option<i32>, sqlx::Error> {
            let rows = e.fetch_all(sqlx::raw_sql(sql)).await?;
            rows.first().map(|r| sqlx::Row::try_get(r, 0)).transpose()
        }
        const BACKEND: &str = "SELECT pg_backend_pid()";
        let mut pooled = self.pool().acquire().await?;
        let mut other = sqlx::PgConnection::connect_with(&self.pool().connect_options()).await?;
        let mut kept: Option<i32> = None;
        let mut verdict = Ok(());
        for _ in 0..3 {
            let first = run(&mut *pooled, BACKEND).await?;
            let held = match run(&mut other, "BEGIN; SELECT pg_backend_pid()").await {
                Ok(held) => held,
                Err(e) if e.to_string().contains("pooling mode") => {
                    // PgBouncer's statement mode refuses a transaction block.
                    verdict = Err(StoreError::SharedSessions(e.to_string()));
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            let again = run(&mut *pooled, BACKEND).await?;
            run(&mut other, "ROLLBACK").await?;
            if held == first || again != first || kept.is_some_and(|k| Some(k) != first) {
                let [first, again, held] = [first, again, held].map(|p| p.unwrap_or_default());
                verdict = Err(StoreError::SharedSessions(format!(
                    "one connection's statements ran in backends {first} and {again}, \
                     and another connection's transaction in {held}"
                )));
                break;
            }
            kept = first;
        }
        let _ = other.close().await;
        verdict
    }
}

//! PostgreSQL: reachable as the configured role, writable, with room for
//! the pool, the migrations applied (or appliable), the privileges held.

use super::{Check, Report};
use crate::config::{MigrateMode, Settings};
use crate::store::{Missing, Server, Store, StoreError};
use crate::telemetry::chain;
use std::time::Duration;

/// A preflight waits this long for PostgreSQL at most.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

pub(super) async fn check(s: &Settings, report: &mut Report) {
    let mut settings = s.store.clone();
    settings.max_connections = 1;
    settings.acquire_timeout = settings.acquire_timeout.min(CONNECT_WITHIN);
    let store = match Store::connect_lazy(&settings) {
        Ok(store) => store,
        Err(e) => {
            report.push(Check::fail(
                "store.connect",
                chain(&e).to_string(),
                "correct store.url (or store.url_file)",
            ));
            return;
        }
    };
    // First, and with simple queries only: through a pooler that shares
    // sessions, the prepared statements of the checks below would fail
    // with errors that say nothing of the pooler.
    match store.check_sessions_kept().await {
        Ok(()) => {}
        Err(e @ StoreError::SharedSessions(_)) => {
            report.push(Check::fail(
                "store.sessions",
                chain(&e).to_string(),
                "set pool_mode = session in the pooler (PgBouncer) for dedupq's database, or \
                 point store.url at PostgreSQL itself",
            ));
            return;
        }
        Err(e) => {
            report.push(unreachable(&store, e).await);
            return;
        }
    }
    let server = match store.server().await {
        Ok(server) => server,
        Err(e) => {
            report.push(unreachable(&store, e).await);
            return;
        }
    };
    let schema = s.store.schema.as_deref().unwrap_or("the search_path");
    report.push(Check::ok(
        "store.connect",
        format!(
            "PostgreSQL {} as {}, database {}, schema {schema}, TLS {}",
            server.version,
            server.user,
            server.database,
            if server.tls { "on" } else { "off" }
        ),
    ));
    report.push(if server.read_only {
        Check::fail(
            "store.writable",
            "transaction_read_only is on: a standby, or default_transaction_read_only set for \
             the role or database; every claim would be refused",
            format!(
                "point store.url at the primary, or ALTER ROLE {} SET \
                 default_transaction_read_only = off",
                server.user
            ),
        )
    } else {
        Check::ok("store.writable", "takes writes")
    });
    report.push(Check::ok(
        "store.sessions",
        "each connection keeps its own session (directly, or through a pooler in session mode)",
    ));
    report.push(connections(s, &server));
    migrations(s, &store, &server.user, report).await;
    privileges(&store, &server.user, report).await;
}

/// `store.connect` failed, for the reason [`Store::explained`] gives.
async fn unreachable(store: &Store, e: StoreError) -> Check {
    let e = store.explained(e).await;
    let too_many = e.sqlstate().as_deref() == Some(TOO_MANY_CONNECTIONS);
    let why = chain(&e);
    let fix = if too_many {
        "PostgreSQL has no connection left for this role (SQLSTATE 53300): raise the role's \
         CONNECTION LIMIT or the server's max_connections, or close idle sessions"
    } else {
        "check store.url (host, port, database, password) and that pg_hba.conf lets this \
         role connect from this host"
    };
    Check::fail(
        "store.connect",
        format!("cannot reach PostgreSQL: {why}"),
        fix,
    )
}

/// `too_many_connections`: the server's or the role's limit is reached.
const TOO_MANY_CONNECTIONS: &str = "53300";

/// Whether the server, and the role's own `CONNECTION LIMIT`, leave room
/// for this process: its pool and its upkeep connection. A limit reached
/// is met at run time as `too many connections` (53300): claims wait.
fn connections(s: &Settings, server: &Server) -> Check {
    let needed = i64::from(s.store.max_connections) + 1;
    let wants = format!(
        "this process opens up to {needed} (store.max_connections {} and one upkeep connection)",
        s.store.max_connections
    );
    let free = server.max_connections - server.reserved - server.connections;
    if free < needed {
        let reserved = match server.reserved {
            0 => String::new(),
            n => format!(", {n} reserved for superusers"),
        };
        return Check::warn(
            "store.connections",
            format!(
                "{free} of max_connections {} free{reserved}; {wants}",
                server.max_connections
            ),
            "raise PostgreSQL's max_connections, lower store.max_connections, or put a pooler in session mode in front of PostgreSQL (docs/production.md)",
        );
    }
    if let Some(limit) = server.role_limit {
        // This check's own connection is the role's too, and closes.
        let elsewhere = server.role_connections - 1;
        let role_free = limit - elsewhere;
        if role_free < needed {
            return Check::warn(
                "store.connections",
                format!(
                    "role {} has CONNECTION LIMIT {limit}, {elsewhere} of them open elsewhere; {wants}",
                    server.user
                ),
                format!(
                    "ALTER ROLE {} CONNECTION LIMIT {} (or -1), or lower store.max_connections",
                    server.user,
                    elsewhere + needed
                ),
            );
        }
    }
    Check::ok(
        "store.connections",
        format!("{free} of {} free; {wants}", server.max_connections),
    )
}

async fn migrations(s: &Settings, store: &Store, user: &str, report: &mut Report) {
    let schema = s.store.schema.as_deref();
    let pending = match store.pending_migrations(schema).await {
        Ok(p) => p,
        Err(e) => {
            report.push(Check::fail(
                "store.migrations",
                format!("cannot read the applied migrations: {}", chain(&e)),
                format!("grant {user} SELECT on _sqlx_migrations, or run dedupq migrate"),
            ));
            return;
        }
    };
    if pending.is_empty() {
        report.push(Check::ok("store.migrations", "every migration is applied"));
        return;
    }
    let names: Vec<String> = pending.iter().map(ToString::to_string).collect();
    let detail = format!("{} pending: {}", pending.len(), names.join(", "));
    let may_create = store.may_create(schema).await.unwrap_or(false);
    report.push(match s.store.migrate {
        MigrateMode::Check => Check::fail(
            "store.migrations",
            format!("{detail}; store.migrate = \"check\" refuses to start"),
            "run dedupq migrate as the schema owner (the Kubernetes migrate Job, or the compose \
             migrate service) before dedupq run",
        ),
        MigrateMode::Auto if may_create => Check::warn(
            "store.migrations",
            format!("{detail}; dedupq run applies them (store.migrate = \"auto\")"),
            "nothing, or run dedupq migrate first to apply them under your own control",
        ),
        MigrateMode::Auto => Check::fail(
            "store.migrations",
            format!("{detail}, and {user} may not create tables there"),
            "run dedupq migrate as the schema owner, or grant CREATE on the schema",
        ),
    });
}

async fn privileges(store: &Store, user: &str, report: &mut Report) {
    let missing = match store.missing_privileges().await {
        Ok(m) => m,
        Err(e) => {
            report.push(Check::fail(
                "store.privileges",
                format!("cannot read the role's privileges: {}", chain(&e)),
                "check that the role may read the catalog",
            ));
            return;
        }
    };
    let lacking: Vec<String> = missing
        .iter()
        .filter_map(|m| match m {
            Missing::Privilege { table, privilege } => Some(format!("{privilege} on {table}")),
            // Reported by store.migrations.
            Missing::Table(_) => None,
        })
        .collect();
    report.push(if !lacking.is_empty() {
        Check::fail(
            "store.privileges",
            format!("{user} lacks {}", lacking.join(", ")),
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON dedupq_keys TO {user}; GRANT SELECT, \
                 INSERT ON dedupq_key_audit TO {user}"
            ),
        )
    } else if missing.is_empty() {
        Check::ok(
            "store.privileges",
            format!("{user} may read and write the key table and its audit table"),
        )
    } else {
        Check::warn(
            "store.privileges",
            "not checked: the key table is not there yet",
            "run dedupq check again after dedupq migrate",
        )
    });
}

//! PostgreSQL settings (`[store]`) and their start-up checks.

use crate::config::{ConfigError, SecretUrl};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// The key table's partitions unless `store.partitions` says otherwise:
/// one, measured fastest both on an empty table and at 10M keys (see
/// BENCHMARKS.md, "How many partitions").
const DEFAULT_PARTITIONS: u32 = 1;

/// The most partitions migration 0005 creates.
const MAX_PARTITIONS: u32 = 1024;

/// PostgreSQL's identifier limit (NAMEDATALEN - 1).
const MAX_SCHEMA_LEN: usize = 63;

/// What `dedupq run` does about the key table's migrations at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrateMode {
    /// Apply pending migrations (one instance at a time, under an advisory
    /// lock). Needs DDL rights only when something is pending.
    #[default]
    Auto,
    /// Only verify that every migration is applied, and refuse to start
    /// otherwise: for a runtime role without DDL rights, with `dedupq
    /// migrate` run as the schema owner before a deploy.
    Check,
}

impl MigrateMode {
    /// The value as `store.migrate` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            MigrateMode::Auto => "auto",
            MigrateMode::Check => "check",
        }
    }
}

/// How durably a commit of dedupq's is acknowledged: PostgreSQL's
/// `synchronous_commit`, set on every session dedupq opens, whatever the
/// server's, database's or role's default. `off` and `local` are not
/// offered: with `off` a crash of PostgreSQL forgets commits it already
/// acknowledged, and with `local` a failover to a synchronous standby
/// does; either way a stored outcome whose message was already committed
/// or acked would be gone, and a redelivery of that key would run its
/// payment again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", try_from = "String")]
pub enum SynchronousCommit {
    /// The commit is flushed to disk, and to the synchronous standbys
    /// `synchronous_standby_names` names, if any.
    #[default]
    On,
    /// As `on`, but a synchronous standby acknowledges once it has written
    /// the commit, before it flushes it.
    RemoteWrite,
    /// As `on`, and a synchronous standby has applied the commit, so a
    /// read from it sees the row.
    RemoteApply,
}

impl TryFrom<String> for SynchronousCommit {
    type Error = String;

    fn try_from(value: String) -> Result<Self, String> {
        match value.as_str() {
            "on" => Ok(SynchronousCommit::On),
            "remote_write" => Ok(SynchronousCommit::RemoteWrite),
            "remote_apply" => Ok(SynchronousCommit::RemoteApply),
            "off" | "local" => Err(format!(
                "`{value}` is refused: PostgreSQL would acknowledge commits that a {} \
                 can take back, and a payment whose outcome was stored (its message \
                 committed or acked) could then run again; use `on`, `remote_write` \
                 or `remote_apply`",
                if value == "off" { "crash" } else { "failover" }
            )),
            other => Err(format!(
                "`{other}` is not one of `on`, `remote_write`, `remote_apply`"
            )),
        }
    }
}

impl SynchronousCommit {
    /// The value as PostgreSQL (and `store.synchronous_commit`) spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SynchronousCommit::On => "on",
            SynchronousCommit::RemoteWrite => "remote_write",
            SynchronousCommit::RemoteApply => "remote_apply",
        }
    }
}

/// `[store]`: the PostgreSQL that holds the key table.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// `store.url` (default
    /// `postgres://postgres:postgres@127.0.0.1:5432/postgres`): the
    /// database, with libpq parameters such as `sslmode`. May carry a
    /// password: hidden in `dedupq config` and logs.
    pub url: SecretUrl,
    /// A file holding the URL (a Kubernetes or Docker secret); wins over
    /// `url`.
    pub url_file: Option<PathBuf>,
    /// Schema holding the key table; None: the connection's search_path.
    pub schema: Option<String>,
    /// `store.migrate` (default `auto`): apply pending migrations at
    /// start-up, or only check that none is pending.
    pub migrate: MigrateMode,
    /// `store.max_connections` (default 8): the pool's size. Claims and
    /// results are batched, so few connections carry a lot; the upkeep
    /// lock takes one more, outside the pool.
    pub max_connections: u32,
    /// `store.acquire_timeout` (default 3s): how long a statement waits for
    /// a connection before it fails, so an outage is noticed fast and the
    /// engine pauses and retries.
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
    /// `store.idle_timeout` (default 2m): a pooled connection idle longer
    /// than this is closed instead of used. A NAT, load balancer or
    /// firewall on the way to PostgreSQL may forget an idle flow without
    /// telling either end, and a statement sent over it then waits for the
    /// kernel's retransmission timeout (about 15 minutes) before it fails;
    /// keep this below the shortest idle timeout on the path.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// `store.statement_deadline` (default 30s): how long a claim, finish,
    /// lease renewal or look-up waits for PostgreSQL's answer before its
    /// connection is dropped and the statement counts as failed (retried
    /// like an outage). A server gone without a reset (a host lost in a
    /// failover, a cut network path) never answers, and the driver has no
    /// TCP keepalive to find out; longer than `store.lock_timeout`.
    #[serde(with = "humantime_serde")]
    pub statement_deadline: Duration,
    /// `store.lock_timeout` (default 1s): how long a claim, finish or lease
    /// renewal waits for a row another transaction holds (an operator's
    /// `SELECT … FOR UPDATE`). Past it, that key alone waits and is tried
    /// again; the rest of its batch goes on.
    #[serde(with = "humantime_serde")]
    pub lock_timeout: Duration,
    /// `store.partitions` (default 1, 1..1024): how many hash partitions
    /// of (tenant, key) the migration that partitions the key table
    /// (0005) creates. Every batch statement plans and prunes over all of
    /// them, so on one PostgreSQL more partitions cost speed (measured at
    /// 0 and 10M keys); they are for retention and vacuum by partition,
    /// and for a distributed PostgreSQL (docs/scale-out.md). Read only
    /// when that migration runs: changing it afterwards does nothing (the
    /// partitions exist). `dedupq migrate --partitions N` overrides it.
    pub partitions: u32,
    /// `store.synchronous_commit` (default `on`; `remote_write`,
    /// `remote_apply`): set on each of dedupq's sessions, so a default of
    /// `off` or `local` on the server, the database or the role never
    /// applies to what dedupq stores.
    pub synchronous_commit: SynchronousCommit,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            url: SecretUrl::new("postgres://postgres:postgres@127.0.0.1:5432/postgres"),
            url_file: None,
            schema: None,
            migrate: MigrateMode::Auto,
            max_connections: 8,
            acquire_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(120),
            statement_deadline: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(1),
            partitions: DEFAULT_PARTITIONS,
            synchronous_commit: SynchronousCommit::On,
        }
    }
}

impl StoreSettings {
    /// Start-up checks of `[store]`: a `postgres://` URL, at least one
    /// connection, a plain schema name. Each error names the setting and
    /// the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.expose();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ConfigError::new(
                "store.url",
                format!("'{}' is not a PostgreSQL URL", self.url),
                "use postgres://user:password@host:5432/database",
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::new(
                "store.max_connections",
                "must be at least 1",
                "set it to 4..16",
            ));
        }
        if self.idle_timeout.is_zero() {
            return Err(ConfigError::new(
                "store.idle_timeout",
                "0 would close every connection before its next statement",
                "set it to about 2m, below any idle timeout between dedupq and PostgreSQL",
            ));
        }
        if self.statement_deadline <= self.lock_timeout {
            return Err(ConfigError::new(
                "store.statement_deadline",
                format!(
                    "{} is not longer than store.lock_timeout ({}): a statement waiting for a \
                     row lock would be cut off as if PostgreSQL were gone",
                    humantime::format_duration(self.statement_deadline),
                    humantime::format_duration(self.lock_timeout)
                ),
                "set it to about 30s",
            ));
        }
        if self.lock_timeout.is_zero() {
            return Err(ConfigError::new(
                "store.lock_timeout",
                "0 would let one locked row hold a whole batch (and its partition) for ever",
                "set it to about 1s",
            ));
        }
        check_partitions(self.partitions)?;
        if let Some(schema) = &self.schema {
            check_schema_name(schema).map_err(|problem| {
                ConfigError::new(
                    "store.schema",
                    problem,
                    "use letters, digits and underscores, starting with a letter or \
                     underscore (upper case is kept as written)",
                )
            })?;
        }
        Ok(())
    }
}

/// `store.partitions` (or `dedupq migrate --partitions`): 1 to 1024.
fn check_partitions(partitions: u32) -> Result<(), ConfigError> {
    if partitions == 0 || partitions > MAX_PARTITIONS {
        return Err(ConfigError::new(
            "store.partitions",
            format!(
                "{partitions} is not a partition count the key table takes (1..{MAX_PARTITIONS})"
            ),
            "leave it at 16, or set it to 1..1024 before the first migrate",
        ));
    }
    Ok(())
}

/// A schema name dedupq accepts: a plain identifier of at most 63 bytes.
/// It reaches PostgreSQL quoted (`"Payments"` keeps its case), and nothing
/// that could close the quote, split the search_path (`,`) or the
/// connection's startup options (spaces) gets that far.
pub fn check_schema_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts_well || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "{name:?} is not a plain identifier (only ASCII letters, digits and '_', \
             not starting with a digit)"
        ));
    }
    if name.len() > MAX_SCHEMA_LEN {
        return Err(format!(
            "{name:?} is longer than PostgreSQL's {MAX_SCHEMA_LEN}-byte identifier limit"
        ));
    }
    if name.starts_with("pg_") {
        return Err(format!("{name:?} uses the pg_ prefix PostgreSQL reserves"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_within_the_lock_timeout_or_no_idle_time_is_refused_naming_the_setting() {
        assert!(StoreSettings::default().validate().is_ok());
        let cut = StoreSettings {
            statement_deadline: Duration::from_secs(1),
            ..StoreSettings::default()
        };
        let e = cut.validate().unwrap_err().to_string();
        assert!(
            e.contains("store.statement_deadline") && e.contains("lock_timeout"),
            "{e}"
        );
        let none = StoreSettings {
            idle_timeout: Duration::ZERO,
            ..StoreSettings::default()
        };
        let e = none.validate().unwrap_err().to_string();
        assert!(e.contains("store.idle_timeout"), "{e}");
    }

    #[test]
    fn synchronous_commit_takes_only_the_durable_levels() {
        for (text, level) in [
            ("on", SynchronousCommit::On),
            ("remote_write", SynchronousCommit::RemoteWrite),
            ("remote_apply", SynchronousCommit::RemoteApply),
        ] {
            assert_eq!(SynchronousCommit::try_from(text.to_string()), Ok(level));
            assert_eq!(level.as_str(), text);
        }
        for (bad, says) in [
            ("off", "crash"),
            ("local", "failover"),
            ("ON", "not one of"),
        ] {
            let e = SynchronousCommit::try_from(bad.to_string()).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn plain_and_mixed_case_schema_names_are_accepted() {
        for ok in ["dedupq", "Payments_EU", "_t1", &"a".repeat(63)] {
            assert_eq!(check_schema_name(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn partition_counts_outside_one_to_1024_are_refused_naming_the_setting() {
        for ok in [1, 16, 1024] {
            assert!(check_partitions(ok).is_ok(), "{ok}");
        }
        for bad in [0, 1025] {
            let e = check_partitions(bad).unwrap_err().to_string();
            assert!(e.contains("store.partitions"), "{e}");
        }
    }

    #[test]
    fn names_that_could_split_or_inject_are_refused() {
        for bad in [
            "",
            "a,public",
            "a -c default_transaction_read_only=on",
            "a\"b",
            "a;b",
            "1abc",
            "ümlaut",
            "pg_temp",
            &"a".repeat(64),
        ] {
            assert!(check_schema_name(bad).is_err(), "{bad:?}");
        }
    }
}

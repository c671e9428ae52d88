use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "dedupq",
    version,
    about = "Exactly-once effects over at-least-once Kafka and RabbitMQ delivery"
)]
pub struct Cli {
    /// TOML configuration file (settings from DEDUPQ__SECTION__FIELD
    /// environment variables override it).
    #[arg(long, short, global = true, env = "DEDUPQ_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log as JSON lines (same as log.format = "json").
    #[arg(long, global = true)]
    pub json_logs: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume the configured Kafka topics and RabbitMQ queues.
    Run,
    /// Apply the key-table migrations and exit (as the schema owner; a
    /// runtime role needs only store.migrate = "check").
    Migrate {
        /// Only report pending migrations; exit 1 if there are any.
        #[arg(long)]
        check: bool,
        /// Partitions of the key table when this run partitions it (1..1024;
        /// default `store.partitions`, 1). Ignored once it is partitioned.
        #[arg(long, value_name = "N")]
        partitions: Option<u32>,
    },
    /// Print the effective configuration (secrets hidden) and exit.
    Config,
    /// Preflight: check PostgreSQL, the brokers, the provider and the files
    /// the configuration names, as `dedupq run` will use them, without
    /// claiming, consuming or charging anything. Exits 1 if a check fails.
    Check {
        /// text (one line per check) or json (one document).
        #[arg(long, value_enum, default_value = "text")]
        output: super::check::ReportFormat,
    },
    /// Inspect and repair idempotency keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// List and replay dead letters (Kafka DLQ topics, the RabbitMQ
    /// dead-letter queue).
    Dlq {
        #[command(subcommand)]
        command: super::dlq::DlqCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Show one key's row as JSON.
    Show { tenant: String, key: String },
    /// List keys: stuck ones (in_progress past the lease, unknown) by default.
    List {
        /// Only keys with this status (in_progress, done, failed, unknown).
        #[arg(long)]
        status: Option<String>,
        /// Only keys whose outcome is unknown.
        #[arg(long, conflicts_with = "status")]
        unknown: bool,
        /// Only this tenant's keys.
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Show the audit table: every release, settle, reset and purge, who
    /// did it and why, newest first.
    Audit {
        /// Only this tenant's lines.
        #[arg(long)]
        tenant: Option<String>,
        /// Only this key's lines.
        #[arg(long)]
        key: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[command(flatten)]
        output: OutputArg,
    },
    /// End an open key's lease now so the next delivery takes it over; writes an audit row.
    /// Refused while a worker holds a live lease, unless --force.
    Release {
        tenant: String,
        key: String,
        #[arg(long)]
        reason: String,
        /// Release even a live lease. Risk: the worker holding it may still
        /// call the provider while the next delivery does too (two
        /// concurrent executions; only a provider honouring the derived key
        /// keeps that to one charge).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// Record what the provider says about a key whose outcome is unknown,
    /// or that is in progress past its lease: duplicates replay it from
    /// then on. Writes an audit row.
    Settle {
        tenant: String,
        key: String,
        /// The provider did charge.
        #[arg(
            long,
            conflicts_with = "failed",
            required_unless_present = "failed",
            requires = "result"
        )]
        done: bool,
        /// The provider did not charge, for good.
        #[arg(long)]
        failed: bool,
        /// With --done: the provider's answer (JSON), stored and replayed.
        #[arg(long)]
        result: Option<String>,
        /// The status code stored with it (default 200 with --done, 0 with --failed).
        #[arg(long)]
        status: Option<i32>,
        /// Why (with --failed: also stored as the failure's reason).
        #[arg(long, required_if_eq("failed", "true"))]
        reason: Option<String>,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// Forget a done or failed key that was stored wrongly (e.g. failed
    /// while the handler was misconfigured): the next delivery runs it
    /// again with the same derived key. Writes an audit row.
    Reset {
        tenant: String,
        key: String,
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        actor: ActorArg,
    },
    /// Delete done/failed keys finished longer ago than the given age (e.g.
    /// 48h). Ages within the redelivery horizon are refused without --force.
    Purge {
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: std::time::Duration,
        /// Purge even within the redelivery horizon: a message redelivered
        /// later would find its key gone and run again.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        actor: ActorArg,
    },
}

/// Who did it, for audit rows and log lines.
#[derive(Debug, Clone, clap::Args)]
pub struct ActorArg {
    /// Name recorded as the actor (default: $USER, then the host name).
    #[arg(long)]
    pub actor: Option<String>,
}

/// How listings are printed.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArg {
    /// table or json (one object a line); default: table on a terminal,
    /// json otherwise.
    #[arg(long, value_enum)]
    pub output: Option<super::output::Format>,
}

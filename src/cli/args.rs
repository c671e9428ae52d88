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
    /// Run the payment-provider simulator (charges once per Idempotency-Key).
    Provider(ProviderArgs),
    /// The main job end to end: a payment stream with duplicates and a
    /// crash through Kafka and RabbitMQ into dedupq, then a summary.
    Demo(ScenarioArgs),
    /// The fault-injection run: kills, restarts, outages, a misbehaving
    /// provider; exits non-zero if any invariant breaks.
    Chaos(ScenarioArgs),
    /// Apply the key-table migrations and exit (as the schema owner; a
    /// runtime role needs only store.migrate = "check").
    Migrate {
        /// Only report pending migrations; exit 1 if there are any.
        #[arg(long)]
        check: bool,
    },
    /// Print the effective configuration (secrets hidden) and exit.
    Config,
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
    /// Measure throughput, latency and memory against the limits (see
    /// BENCHMARKS.md); needs PostgreSQL, Kafka and RabbitMQ.
    Bench(crate::bench::BenchArgs),
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
    /// Record what the provider says about a key whose outcome is unknown:
    /// duplicates replay it from then on. Writes an audit row.
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

#[derive(Debug, clap::Args)]
pub struct ProviderArgs {
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: std::net::SocketAddr,
    /// Schema for the simulator's charges, in the database of store.url.
    #[arg(long, default_value = "dedupq_provider")]
    pub schema: String,
    /// Delay between recording a charge and answering (e.g. 300ms).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub latency: std::time::Duration,
    /// Share of requests answered 503 before charging (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Share of charges declined with 402 (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub decline_rate: f64,
    /// Share of requests that charge and then never answer (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub hang_after_charge_rate: f64,
    /// Charge on every request, ignoring Idempotency-Key.
    #[arg(long)]
    pub ignore_keys: bool,
    /// How a repeated key's body is compared with the first: json
    /// (canonical JSON) or bytes (any byte difference answers 422).
    #[arg(long, value_enum, default_value = "json")]
    pub compare: crate::provider::Compare,
    /// How long a slow request runs after charging before it answers (see
    /// --slow-after-charge-rate).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub slow_after_charge: std::time::Duration,
    /// Share of requests that charge, then answer only after
    /// --slow-after-charge (0..1); a repeat meanwhile gets 409.
    #[arg(long, default_value_t = 0.0)]
    pub slow_after_charge_rate: f64,
}

#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {
    /// demo, ci, hostile (poison on both transports and a hostile provider, no service restarts), dependencies (PostgreSQL read-only, timing out and row-locked, a provider failing after it charged and in an outage, a process frozen past its lease; no service restarts), long, or broken (short, for builds with a guarantee switched off).
    #[arg(long)]
    pub profile: Option<String>,
    #[command(flatten)]
    pub brokers: BrokerArgs,
    /// The script that restarts PostgreSQL and Kafka during chaos runs.
    #[arg(long, default_value = "scripts/services")]
    pub services: PathBuf,
    /// Logs of the processes of the run.
    #[arg(long, default_value = "/var/tmp/dedupq-scenarios")]
    pub workdir: PathBuf,
}

/// Where the brokers are, for commands that publish and consume themselves.
#[derive(Debug, Clone, clap::Args)]
pub struct BrokerArgs {
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: String,
}

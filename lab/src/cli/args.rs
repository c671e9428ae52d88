use crate::bench::BenchArgs;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// The `dedupq-lab` command line.
#[derive(Debug, Parser)]
#[command(
    name = "dedupq-lab",
    version,
    about = "dedupq's lab: the demo, the chaos runs and the benchmark against the real services"
)]
pub struct Cli {
    /// dedupq's TOML configuration file (settings from DEDUPQ__SECTION__FIELD
    /// environment variables override it): store.url is the database the
    /// runs use, and the bench measures this configuration.
    #[arg(long, short, global = true, env = "DEDUPQ_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log as JSON lines (same as log.format = "json").
    #[arg(long, global = true)]
    pub json_logs: bool,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// What to run.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The main job end to end: a payment stream with duplicates and a
    /// crash through Kafka and RabbitMQ into dedupq, then a summary.
    Demo(ScenarioArgs),
    /// The fault-injection run: kills, restarts, outages, a misbehaving
    /// provider; exits non-zero if any invariant breaks.
    Chaos(ScenarioArgs),
    /// Measure throughput, latency and memory against the limits (see
    /// BENCHMARKS.md); needs PostgreSQL, Kafka and RabbitMQ.
    Bench(BenchArgs),
}

/// The demo's and the chaos run's options.
#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {
    /// demo, ci, hostile (poison on both transports and a hostile provider, no service restarts), dependencies (PostgreSQL read-only, timing out and row-locked, a provider failing after it charged and in an outage, a process frozen past its lease; no service restarts), long, or broken (short, for builds with a guarantee switched off).
    #[arg(long)]
    pub profile: Option<String>,
    /// Where the brokers are.
    #[command(flatten)]
    pub brokers: BrokerArgs,
    /// The script that restarts PostgreSQL and Kafka during chaos runs.
    #[arg(long, default_value = "scripts/services")]
    pub services: PathBuf,
    /// Logs of the processes of the run.
    #[arg(long, default_value = "/var/tmp/dedupq-scenarios")]
    pub workdir: PathBuf,
    /// The dedupq binary the run starts as `dedupq run` (default: the one
    /// beside dedupq-lab, from the same cargo build).
    #[arg(long, env = "DEDUPQ_BIN")]
    pub dedupq_bin: Option<PathBuf>,
    /// The provider simulator's binary (default: the dedupq-provider beside
    /// dedupq-lab).
    #[arg(long, env = "DEDUPQ_PROVIDER_BIN")]
    pub dedupq_provider_bin: Option<PathBuf>,
}

/// Where the brokers are, for commands that publish and consume themselves.
#[derive(Debug, Clone, clap::Args)]
pub struct BrokerArgs {
    /// Kafka's bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// RabbitMQ's URL.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: String,
}

//! `dedupq dlq …` arguments.

use crate::cli::args::OutputArg;
use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Show dead letters without taking them off the dead-letter topic or queue.
    List(DlqArgs),
    /// Publish matching dead letters back to their source with their
    /// original headers. A dry run unless --execute is given.
    Replay {
        #[command(flatten)]
        args: DlqArgs,
        /// Publish for real (RabbitMQ: each replayed message leaves the
        /// dead-letter queue once the broker confirmed the replay).
        #[arg(long)]
        execute: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Kafka,
    Amqp,
}

#[derive(Debug, clap::Args)]
pub struct DlqArgs {
    /// kafka: the DLQ topics of the source topics; amqp: the dead-letter queue.
    #[arg(value_enum)]
    pub transport: Transport,
    /// Kafka source topic whose DLQ (TOPIC + kafka.dlq_suffix) is read;
    /// repeatable (default: every topic in kafka.topics).
    #[arg(long = "topic")]
    pub topics: Vec<String>,
    /// RabbitMQ dead-letter queue (default: amqp.dead_letter_queue).
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this reason (dedupq-reason, or the broker's x-death reason such
    /// as delivery_limit).
    #[arg(long)]
    pub reason: Option<String>,
    /// Only this tenant (dedupq-tenant).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only dead letters first seen at or after this time: RFC 3339
    /// (2026-05-01T10:00:00Z) or an age (2h).
    #[arg(long, value_parser = parse_time)]
    pub since: Option<DateTime<Utc>>,
    /// Only dead letters first seen before this time (same forms).
    #[arg(long, value_parser = parse_time)]
    pub until: Option<DateTime<Utc>>,
    /// At most this many matching dead letters.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    #[command(flatten)]
    pub output: OutputArg,
}

/// RFC 3339, or an age counted back from now.
pub(super) fn parse_time(s: &str) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let age = humantime::parse_duration(s)
        .with_context(|| format!("'{s}' is neither an RFC 3339 time nor an age like 2h"))?;
    Ok(Utc::now() - chrono::Duration::from_std(age).context("age too large")?)
}

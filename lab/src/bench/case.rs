//! What is measured (a case), what one child process is asked to do (a
//! job) and what it reports back (a measurement).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The consumer under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// (a) Kafka -> dedupq (`Application`, fast in-process handler) -> commit;
    /// with a rate, (g): -> the reply on `kafka.reply_topic`.
    Dedupq,
    /// (b) one claim and one completion statement per message, sequential
    /// per partition.
    Naive,
    /// (c) Kafka consume and commit, no deduplication.
    RawKafka,
    /// (d) `Store::claim_batch` + `Store::finish_batch` alone.
    PgLimit,
    /// (e) RabbitMQ -> dedupq -> ack.
    DedupqAmqp,
    /// (e) RabbitMQ consume and ack, no deduplication.
    RawAmqp,
    /// (f) the narrowest claim table and two statements per batch, no
    /// broker: the floor of any PostgreSQL-backed deduplication.
    MinimalClaim,
    /// (g) Kafka consume -> produce the record to the reply topic, nothing
    /// else.
    Echo,
    /// (h) The HTTP API's sync route (`partitions`: concurrent clients).
    HttpSync,
    /// (h) The same handler behind a plain HTTP route, no deduplication.
    HttpDirect,
    /// (h) The seed's claim-first recipe behind a plain HTTP route: per
    /// request one claim statement and one outcome statement on a pool of
    /// connections, each its own transaction.
    HttpSeed,
}

impl Kind {
    pub fn uses_kafka(self) -> bool {
        matches!(
            self,
            Kind::Dedupq | Kind::Naive | Kind::RawKafka | Kind::Echo
        )
    }

    pub fn uses_amqp(self) -> bool {
        matches!(self, Kind::DedupqAmqp | Kind::RawAmqp)
    }

    /// Runs without messages prepared on a broker (PostgreSQL alone, or
    /// HTTP requests the case sends itself).
    pub fn brokerless(self) -> bool {
        matches!(
            self,
            Kind::PgLimit | Kind::MinimalClaim | Kind::HttpSync | Kind::HttpDirect | Kind::HttpSeed
        )
    }
}

/// One row of the table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Case {
    /// Row label, also used by `--only` and the ratio checks.
    pub label: String,
    pub kind: Kind,
    /// Kafka partitions; for `PgLimit` and `MinimalClaim` the number of
    /// connections; for the HTTP cases the number of concurrent clients.
    pub partitions: i32,
    /// Messages of the throughput run (duplicates included).
    pub messages: usize,
    /// Every key sent twice (50% of the messages are duplicates).
    pub duplicates: bool,
    /// Key-table schema to use as it is (the 10M-row table); None: a
    /// fresh schema, dropped afterwards.
    pub schema: Option<String>,
    /// A latency row: messages sent at this fixed rate (per second) for
    /// `latency_secs`, each timed from `send()` to its reply; no
    /// throughput run.
    #[serde(default)]
    pub rate: Option<f64>,
    pub latency_secs: f64,
    /// The run starts right after a `CHECKPOINT`: the first change to each
    /// page pays a full-page image in the WAL, as in the minutes after
    /// every checkpoint. Otherwise the run finds the pages as the run
    /// before it left them.
    #[serde(default)]
    pub checkpoint_first: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Everything is pre-produced; consume it as fast as possible.
    Throughput,
    /// Warm up, print READY, then consume a stream paced at the case's
    /// rate and answer every message on the reply topic.
    Latency,
}

/// What the parent hands one child process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub case: Case,
    pub phase: Phase,
    /// Kafka topic or RabbitMQ queue.
    pub source: String,
    /// Messages the child must see before it stops.
    pub expected: usize,
    /// Of those, the warm-up messages sent before READY.
    pub warmup: usize,
    pub schema: String,
    pub database_url: String,
    pub brokers: String,
    pub amqp_url: String,
    /// Latency runs: where every message is answered.
    #[serde(default)]
    pub reply_topic: Option<String>,
    /// The child's own stderr (dedupq's log).
    pub log_path: PathBuf,
}

/// What one child measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Measured {
    pub messages: usize,
    pub seconds: f64,
    /// Latency samples, milliseconds (p50, p99, count): send() to reply
    /// for latency rows; one batch's round trips for (d) and (f).
    pub latency: Option<(f64, f64, usize)>,
    /// VmHWM of the child, kB.
    pub peak_rss_kb: u64,
    /// Breakdown and sanity checks, printed under the table.
    pub notes: Vec<String>,
}

impl Measured {
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.messages as f64 / self.seconds
        } else {
            0.0
        }
    }
}

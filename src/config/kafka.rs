//! Kafka settings (`[kafka]`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// `[kafka]`: the Kafka transport, off while `kafka.topics` is empty.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSettings {
    /// Topics to consume; empty: the Kafka transport is off.
    pub topics: Vec<String>,
    /// `kafka.brokers` (default `127.0.0.1:9092`): the bootstrap servers
    /// (librdkafka's `bootstrap.servers`), for consumer and producer.
    pub brokers: String,
    /// `kafka.group_id` (default `dedupq`): the consumer group. Replicas of
    /// one deployment share it, and so share the partitions.
    pub group_id: String,
    /// Dead letters go to `<topic><dlq_suffix>`.
    pub dlq_suffix: String,
    /// If set, every outcome (fresh or stored) is produced here, keyed by
    /// the idempotency key.
    pub reply_topic: Option<String>,
    /// Extra librdkafka properties (e.g. security.protocol, sasl.*, ssl.*),
    /// passed through to both consumer and producer. They win over the
    /// settings dedupq sets itself, except the ones the offset guarantee
    /// depends on (auto commit off, no automatic offset store).
    pub client: BTreeMap<String, String>,
    /// librdkafka properties read from files (property -> path), e.g.
    /// `"sasl.password" = "/run/secrets/kafka-password"`: for secrets
    /// mounted by Kubernetes or Docker.
    pub client_files: BTreeMap<String, PathBuf>,
    /// Most messages handed to the engine in one call (one claim round trip).
    pub batch_size: usize,
    /// How long a batch waits for more messages once the first is ready.
    /// 0: it starts at once with what has arrived; while every batch slot
    /// is busy, a backlog fills the next batch anyway.
    #[serde(with = "humantime_serde")]
    pub batch_linger: Duration,
    /// Batches processed at once. A partition is in at most three of them,
    /// which never share a key, so one key's messages keep their order.
    pub max_batches_in_flight: usize,
    /// Bytes of fetched messages held over all partitions (queued or in a
    /// batch) before fetching pauses everywhere; resumes below half.
    pub max_buffered_bytes: usize,
    /// A partition with waiting messages and no durable outcome for this
    /// long is reported stalled (/readyz, `dedupq_stalled_lanes`).
    #[serde(with = "humantime_serde")]
    pub stall_after: Duration,
    /// Largest dead-letter record produced: past it, the payload (then the
    /// original headers) is left out and recorded in headers, so a dead
    /// letter always fits the producer's `message.max.bytes` (1,000,000 by
    /// default).
    pub dead_letter_max_bytes: usize,
    /// Create missing dead-letter and reply topics at start-up (one
    /// partition, the broker's default replication); otherwise a missing
    /// one stops start-up.
    pub create_topics: bool,
    /// Messages held per partition (queued or in a batch) before fetching
    /// from that partition is paused. Pausing makes librdkafka drop what it
    /// prefetched for the partition and fetch it again on resume, so this
    /// is a backstop for a stalled store, not a steady-state throttle.
    pub max_buffered_per_partition: usize,
    /// Shortest time between two commits of the contiguous prefix of
    /// durable outcomes: a batch that finishes commits at once if the last
    /// commit is this old, else as soon as it is.
    #[serde(with = "humantime_serde")]
    pub commit_interval: Duration,
    /// On revoke and shutdown, how long in-flight batches of the partitions
    /// that go away may take to finish before what is done is committed.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Where a group without a committed offset starts: `earliest` (never
    /// skip a payment) or `latest`.
    pub auto_offset_reset: String,
    /// The group coordinator declares this member dead after this silence;
    /// its partitions then move to the others.
    #[serde(with = "humantime_serde")]
    pub session_timeout: Duration,
    /// How often client statistics (consumer lag per partition, broker
    /// state) are refreshed.
    #[serde(with = "humantime_serde")]
    pub stats_interval: Duration,
    /// How long a dead-letter or reply record may take to be confirmed
    /// before the produce is tried again.
    #[serde(with = "humantime_serde")]
    pub produce_timeout: Duration,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            topics: Vec::new(),
            brokers: "127.0.0.1:9092".into(),
            group_id: "dedupq".into(),
            dlq_suffix: ".dlq".into(),
            reply_topic: None,
            client: BTreeMap::new(),
            client_files: BTreeMap::new(),
            batch_size: 500,
            batch_linger: Duration::ZERO,
            max_batches_in_flight: 4,
            max_buffered_per_partition: 10000,
            max_buffered_bytes: 64 * 1024 * 1024,
            stall_after: Duration::from_secs(60),
            dead_letter_max_bytes: 900_000,
            create_topics: false,
            commit_interval: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(15),
            auto_offset_reset: "earliest".into(),
            session_timeout: Duration::from_secs(30),
            stats_interval: Duration::from_secs(5),
            produce_timeout: Duration::from_secs(30),
        }
    }
}

impl KafkaSettings {
    /// The defaults, reaching `brokers`: a client of the lab or the tests.
    pub fn at(brokers: &str) -> Self {
        Self {
            brokers: brokers.to_string(),
            ..Self::default()
        }
    }
}

//! Kafka settings (`[kafka]`).

use super::ConfigError;
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
    /// Where a group without a committed offset starts: `earliest`, the
    /// only value accepted (`latest` would skip every payment already on
    /// the topic). To start a new group at the end of a topic, set its
    /// offsets before the first start (`kafka-consumer-groups.sh
    /// --reset-offsets --to-latest --execute`).
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
    /// While consuming, no broker reached for this long: the consumer is
    /// rebuilt with a new client (its batches drained and committed as on
    /// shutdown, a new group member). A librdkafka client can stay cut off
    /// from its group coordinator after a broker restart while the others
    /// work; a new one finds it. In a real outage the new client waits as
    /// the old one did. At least two `stats_interval`s.
    #[serde(with = "humantime_serde")]
    pub restart_after_down: Duration,
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
            restart_after_down: Duration::from_secs(60),
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

/// `[kafka.client]` keys dedupq sets itself and refuses to take from
/// there, each with what it protects: they are never passed to any client.
pub const MANAGED_CLIENT_KEYS: [(&str, &str); 5] = [
    (
        "enable.auto.commit",
        "offsets are committed only after outcomes are durable",
    ),
    (
        "auto.commit.enable",
        "offsets are committed only after outcomes are durable",
    ),
    (
        "enable.auto.offset.store",
        "offsets are committed only after outcomes are durable",
    ),
    (
        "isolation.level",
        "read_committed keeps records of aborted producer transactions from being charged",
    ),
    (
        "auto.offset.reset",
        "set kafka.auto_offset_reset; a group without offsets must not skip payments",
    ),
];

impl KafkaSettings {
    /// The first `[kafka.client]` key that dedupq manages itself, with
    /// what it protects.
    pub fn managed_client_key(&self) -> Option<(&'static str, &'static str)> {
        MANAGED_CLIENT_KEYS
            .into_iter()
            .find(|(k, _)| self.client.contains_key(*k))
    }

    /// The checks of `[kafka]` while `kafka.topics` names any topic: run
    /// when the configuration is loaded (so `dedupq config` sees them) and
    /// again when the transport starts from settings built in code.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |setting: &str, problem: &str, fix: &str| {
            Err(ConfigError::new(&format!("kafka.{setting}"), problem, fix))
        };
        for (setting, value) in [
            ("batch_size", self.batch_size),
            ("max_batches_in_flight", self.max_batches_in_flight),
        ] {
            if value == 0 {
                return bad(setting, "must be at least 1", "set a positive value");
            }
        }
        if self.max_buffered_per_partition < 2 {
            return bad(
                "max_buffered_per_partition",
                "must be at least 2",
                "the default is 10000",
            );
        }
        for (setting, value) in [
            ("commit_interval", self.commit_interval),
            ("stats_interval", self.stats_interval),
            ("session_timeout", self.session_timeout),
            ("produce_timeout", self.produce_timeout),
        ] {
            if value.is_zero() {
                return bad(setting, "must be longer than 0s", "set a positive duration");
            }
        }
        if self.restart_after_down < self.stats_interval * 2 {
            return bad(
                "restart_after_down",
                &format!(
                    "{:?} is shorter than two kafka.stats_interval ({:?}): the brokers' state \
                     is only known at each statistics report",
                    self.restart_after_down, self.stats_interval
                ),
                "the default is 1m",
            );
        }
        if self.auto_offset_reset != "earliest" {
            return bad(
                "auto_offset_reset",
                &format!(
                    "'{}' is refused: a new or reset consumer group would skip every payment \
                     already on the topic, and they would never be processed",
                    self.auto_offset_reset
                ),
                "use \"earliest\"; to start a new group at the end of a topic on purpose, set \
                 its offsets before the first start (kafka-consumer-groups.sh --reset-offsets \
                 --to-latest --execute)",
            );
        }
        if self.dlq_suffix.is_empty() {
            return bad(
                "dlq_suffix",
                "is empty: dead letters would go back to the topic they came from",
                "the default is .dlq",
            );
        }
        for topic in self.topics.iter().chain(&self.reply_topic) {
            if !valid_topic(topic) {
                return bad(
                    "topics",
                    &format!(
                        "'{topic}' is not a valid Kafka topic name (1..=249 of a-z A-Z 0-9 . _ -)"
                    ),
                    "rename the topic",
                );
            }
            let dlq = format!("{topic}{}", self.dlq_suffix);
            if self.topics.contains(topic) && !valid_topic(&dlq) {
                return bad(
                    "dlq_suffix",
                    &format!(
                        "'{}' makes the dead-letter topic '{dlq}', which is not a valid Kafka \
                         topic name (a-z A-Z 0-9 . _ -, at most 249)",
                        self.dlq_suffix
                    ),
                    "use a short suffix of those characters, e.g. .dlq",
                );
            }
        }
        if self.dead_letter_max_bytes < 4096 {
            return bad(
                "dead_letter_max_bytes",
                "must be at least 4096",
                "the default is 900000",
            );
        }
        if self.max_buffered_bytes < 1024 * 1024 {
            return bad(
                "max_buffered_bytes",
                "must be at least 1 MiB",
                "the default is 67108864 (64 MiB)",
            );
        }
        if let Some((key, why)) = self.managed_client_key() {
            return Err(ConfigError::new(
                &format!("kafka.client.{key}"),
                format!("`{key}` is managed by dedupq ({why})"),
                "remove it from [kafka.client]",
            ));
        }
        Ok(())
    }
}

/// Kafka's own rule for topic names.
fn valid_topic(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consuming() -> KafkaSettings {
        KafkaSettings {
            topics: vec!["payments".into()],
            ..KafkaSettings::default()
        }
    }

    #[test]
    fn latest_is_refused_and_names_the_setting() {
        let mut s = consuming();
        assert!(s.validate().is_ok());
        for value in ["latest", "largest", "end", "smallest", ""] {
            s.auto_offset_reset = value.into();
            let e = s.validate().unwrap_err();
            assert_eq!(e.setting, "kafka.auto_offset_reset", "{value}");
        }
    }

    #[test]
    fn intervals_of_zero_are_refused() {
        for set in [
            |s: &mut KafkaSettings| s.commit_interval = Duration::ZERO,
            |s: &mut KafkaSettings| s.stats_interval = Duration::ZERO,
            |s: &mut KafkaSettings| s.session_timeout = Duration::ZERO,
            |s: &mut KafkaSettings| s.produce_timeout = Duration::ZERO,
        ] {
            let mut s = consuming();
            set(&mut s);
            assert!(s.validate().is_err(), "{s:?}");
        }
    }

    #[test]
    fn a_restart_after_down_shorter_than_two_statistics_reports_is_refused() {
        let mut s = consuming();
        s.stats_interval = Duration::from_secs(5);
        s.restart_after_down = Duration::from_secs(9);
        let e = s.validate().unwrap_err();
        assert_eq!(e.setting, "kafka.restart_after_down");
        s.restart_after_down = Duration::from_secs(10);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn every_managed_client_key_is_refused_with_what_it_protects() {
        for (key, why) in MANAGED_CLIENT_KEYS {
            let mut s = consuming();
            s.client.insert(key.into(), "whatever".into());
            let e = s.validate().unwrap_err();
            assert_eq!(e.setting, format!("kafka.client.{key}"));
            assert!(e.problem.contains(why), "{e}");
        }
        let mut s = consuming();
        s.client
            .insert("isolation.level".into(), "read_uncommitted".into());
        assert!(s.validate().is_err());
    }
}

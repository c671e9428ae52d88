//! librdkafka settings of the consumer and of the producer (dead letters,
//! replies). Every setting the guarantees depend on is spelled out here.

use super::error::KafkaError;
use crate::config::KafkaSettings;
use rdkafka::ClientConfig;

/// Passthrough keys that would break "commit only after the outcome is
/// stored"; refused at start-up.
const PROTECTED: [&str; 2] = ["enable.auto.commit", "enable.auto.offset.store"];

pub fn validate(s: &KafkaSettings) -> Result<(), KafkaError> {
    let bad = |setting, problem: &str| {
        Err(KafkaError::Config {
            setting,
            problem: problem.into(),
        })
    };
    if s.batch_size == 0 {
        return bad("batch_size", "must be at least 1");
    }
    if s.max_batches_in_flight == 0 {
        return bad("max_batches_in_flight", "must be at least 1");
    }
    if s.max_buffered_per_partition < 2 {
        return bad("max_buffered_per_partition", "must be at least 2");
    }
    if s.dlq_suffix.is_empty() {
        return bad(
            "dlq_suffix",
            "is empty: dead letters would go back to the topic they came from",
        );
    }
    for topic in s.topics.iter().chain(&s.reply_topic) {
        if !valid_topic(topic) {
            return bad(
                "topics",
                &format!(
                    "'{topic}' is not a valid Kafka topic name (1..=249 of a-z A-Z 0-9 . _ -)"
                ),
            );
        }
        let dlq = format!("{topic}{}", s.dlq_suffix);
        if s.topics.contains(topic) && !valid_topic(&dlq) {
            return bad(
                "dlq_suffix",
                &format!("'{}' makes the dead-letter topic '{dlq}', which is not a valid Kafka topic name (a-z A-Z 0-9 . _ -, at most 249)", s.dlq_suffix),
            );
        }
    }
    if s.dead_letter_max_bytes < 4096 {
        return bad("dead_letter_max_bytes", "must be at least 4096");
    }
    if s.max_buffered_bytes < 1024 * 1024 {
        return bad("max_buffered_bytes", "must be at least 1 MiB");
    }
    if let Some(key) = PROTECTED.iter().find(|k| s.client.contains_key(**k)) {
        return Err(KafkaError::Config {
            setting: "client",
            problem: format!(
                "`{key}` is managed by dedupq (offsets are committed only after outcomes \
                 are durable); remove it"
            ),
        });
    }
    Ok(())
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

fn millis(d: std::time::Duration) -> String {
    d.as_millis().max(1).to_string()
}

pub fn consumer_config(s: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &s.brokers)
        .set("group.id", &s.group_id)
        .set("client.id", "dedupq")
        // Offsets are committed explicitly, from the contiguous prefix of
        // durable outcomes: one place decides what is committed, the revoke
        // callback commits exactly that prefix synchronously, and nothing is
        // committed behind our back while PostgreSQL is down. (Auto commit
        // plus store_offset would work too, but commits then happen on
        // librdkafka's timer, also in the middle of a revoke.)
        .set("enable.auto.commit", "false")
        // Never let librdkafka store a consumed position on its own.
        .set("enable.auto.offset.store", "false")
        // A group without a committed offset must not skip payments.
        .set("auto.offset.reset", &s.auto_offset_reset)
        // Incremental rebalances: only moving partitions are revoked, and
        // the commit in the revoke callback still succeeds.
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", millis(s.session_timeout))
        // Three heartbeats per session, as Kafka recommends.
        .set("heartbeat.interval.ms", millis(s.session_timeout / 3))
        // The loop keeps polling (it pauses partitions instead of stopping),
        // so the default 5 min only trips if the process is wedged.
        .set("max.poll.interval.ms", "300000")
        // Records of aborted producer transactions are never processed.
        .set("isolation.level", "read_committed")
        // End-of-partition events are not needed.
        .set("enable.partition.eof", "false")
        // Bounds librdkafka's prefetch memory (one queue for all
        // partitions); the loop takes from it only what its batches need
        // next, and bounds its own buffer in bytes besides.
        .set("queued.max.messages.kbytes", "16384")
        // Once that queue is full, fetch again soon after it has room:
        // librdkafka's default waits a second, which starves a consumer
        // that empties 16 MiB faster than that.
        .set("fetch.queue.backoff.ms", "50")
        // Consumer lag and broker state for metrics and /readyz.
        .set("statistics.interval.ms", millis(s.stats_interval));
    for (k, v) in &s.client {
        c.set(k, v);
    }
    c
}

/// For start-up checks (topics, their retention).
pub fn admin_config(s: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &s.brokers)
        .set("client.id", "dedupq-admin");
    for (k, v) in &s.client {
        if !PROTECTED.contains(&k.as_str()) {
            c.set(k, v);
        }
    }
    c
}

pub fn producer_config(s: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &s.brokers)
        .set("client.id", "dedupq-producer")
        // A source offset advances once its dead letter is confirmed: the
        // confirmation must mean every in-sync replica has it.
        .set("acks", "all")
        // Producer retries never duplicate or reorder a dead letter.
        .set("enable.idempotence", "true")
        // Bounds one delivery attempt; a failed one is produced again.
        .set("message.timeout.ms", millis(s.produce_timeout))
        // A reply leaves at once; the records of a batch still travel
        // together, queued while the previous request is under way.
        .set("linger.ms", "0")
        // Room for the largest dead letter (kafka.dead_letter_max_bytes)
        // plus the record framing.
        .set(
            "message.max.bytes",
            (s.dead_letter_max_bytes + 64 * 1024)
                .max(1_000_000)
                .to_string(),
        );
    for (k, v) in &s.client {
        if !PROTECTED.contains(&k.as_str()) {
            c.set(k, v);
        }
    }
    c
}

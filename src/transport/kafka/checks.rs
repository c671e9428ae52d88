//! Start-up checks of `[kafka]` for the consumer; its clients are built by
//! `crate::broker::kafka`.

use super::error::KafkaError;
use crate::config::KafkaSettings;

pub(super) fn validate(s: &KafkaSettings) -> Result<(), KafkaError> {
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
    if let Some(key) = crate::broker::kafka::protected_key(s) {
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

//! librdkafka settings of every Kafka client. Every setting a guarantee
//! depends on is spelled out here; `[kafka.client]` (TLS, SASL, …) is
//! applied to each client after dedupq's own settings and wins over them,
//! except the keys the offset guarantee depends on.

use crate::config::kafka::MANAGED_CLIENT_KEYS;
use crate::config::KafkaSettings;
use rdkafka::ClientConfig;
use std::time::Duration;

/// Whether `[kafka.client]`'s `key` is one dedupq manages itself
/// (`config::kafka::MANAGED_CLIENT_KEYS`): refused when the settings are
/// loaded, and never passed to any client.
fn managed(key: &str) -> bool {
    MANAGED_CLIENT_KEYS.iter().any(|(k, _)| *k == key)
}

fn millis(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

/// `[kafka.client]`, without the keys dedupq manages.
fn passthrough(c: &mut ClientConfig, s: &KafkaSettings) {
    for (k, v) in &s.client {
        if !managed(k) {
            c.set(k, v);
        }
    }
}

/// The brokers and who is asking: the start of every client.
fn new(s: &KafkaSettings, client_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &s.brokers)
        .set("client.id", client_id);
    c
}

/// The brokers, a client id and `[kafka.client]`: what the lab and the
/// tests add their own settings to.
pub fn client(s: &KafkaSettings, client_id: &str) -> ClientConfig {
    let mut c = new(s, client_id);
    passthrough(&mut c, s);
    c
}

/// The consumer-group member of the Kafka transport.
pub fn consumer(s: &KafkaSettings) -> ClientConfig {
    let mut c = new(s, "dedupq");
    c.set("group.id", &s.group_id)
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
    passthrough(&mut c, s);
    c
}

/// Who produces: each producer has its own client id and waits as its use
/// needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Producing {
    /// The consumer's dead letters and replies.
    Outbox,
    /// The async routes of the HTTP API.
    Api,
    /// `dedupq dlq replay`.
    Replay,
}

/// A producer whose confirmation means every in-sync replica has the
/// record, and whose retries never duplicate or reorder one.
pub fn producer(s: &KafkaSettings, producing: Producing) -> ClientConfig {
    let client_id = match producing {
        Producing::Outbox => "dedupq-producer",
        Producing::Api => "dedupq-api",
        Producing::Replay => "dedupq-dlq",
    };
    let mut c = new(s, client_id);
    // A source offset advances once its dead letter is confirmed, and 202
    // says the command is durable: the confirmation must mean every in-sync
    // replica has it.
    c.set("acks", "all")
        // Producer retries never duplicate or reorder a record.
        .set("enable.idempotence", "true")
        // Bounds one delivery: a dead letter is produced again, an API
        // client gets 503 and retries its key, a replay reports a failure.
        .set("message.timeout.ms", millis(s.produce_timeout));
    match producing {
        Producing::Outbox | Producing::Replay => {
            let max = (s.dead_letter_max_bytes + 64 * 1024).max(1_000_000);
            // A reply or replay leaves at once; the records of a batch still
            // travel together, queued while the previous request is under
            // way.
            c.set("linger.ms", "0")
                // Room for the largest dead letter
                // (kafka.dead_letter_max_bytes) plus the record framing.
                .set("message.max.bytes", max.to_string());
        }
        // A request waits for its own record: do not hold it for a batch.
        Producing::Api => {
            c.set("linger.ms", "1");
        }
    }
    passthrough(&mut c, s);
    not_a_member(&mut c);
    c
}

/// For start-up checks (topics, their retention).
pub fn admin(s: &KafkaSettings) -> ClientConfig {
    let mut c = client(s, "dedupq-admin");
    not_a_member(&mut c);
    c
}

/// A client that is not the transport's group member does not carry its
/// static membership: a producer would warn that it ignores it, and a
/// reader must never be taken for the member itself.
fn not_a_member(c: &mut ClientConfig) {
    c.remove("group.instance.id");
}

/// A consumer that is given its partitions (`assign`) and never commits: it
/// reads a topic and moves nothing (`dedupq dlq`, the lab's checks).
pub fn reader(s: &KafkaSettings, group: &str) -> ClientConfig {
    let mut c = client(s, "dedupq-reader");
    not_a_member(&mut c);
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false");
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passthrough_key_wins_except_the_ones_the_offset_guarantee_needs() {
        let mut s = KafkaSettings::default();
        s.client.insert("session.timeout.ms".into(), "45000".into());
        s.client.insert("enable.auto.commit".into(), "true".into());
        s.client
            .insert("isolation.level".into(), "read_uncommitted".into());
        let c = consumer(&s);
        assert_eq!(c.get("session.timeout.ms"), Some("45000"));
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        assert_eq!(
            s.managed_client_key().map(|(k, _)| k),
            Some("enable.auto.commit")
        );
        let p = producer(&s, Producing::Api);
        assert_eq!(p.get("enable.auto.commit"), None);
        assert_eq!(reader(&s, "g").get("enable.auto.commit"), Some("false"));
    }

    #[test]
    fn static_membership_goes_to_the_group_member_only() {
        let mut s = KafkaSettings::default();
        s.client.insert("group.instance.id".into(), "pod-0".into());
        assert_eq!(consumer(&s).get("group.instance.id"), Some("pod-0"));
        for p in [Producing::Outbox, Producing::Api, Producing::Replay] {
            assert_eq!(producer(&s, p).get("group.instance.id"), None);
        }
        assert_eq!(admin(&s).get("group.instance.id"), None);
        assert_eq!(reader(&s, "g").get("group.instance.id"), None);
    }
}

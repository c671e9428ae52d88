//! Kafka dead letters: read `<topic><kafka.dlq_suffix>` from its low to its
//! high watermark with a reader that never commits (the DLQ stays as it
//! is), and replay to the source topic. Kafka topics are append-only, so a
//! replayed record stays in the DLQ, and a replayed message that fails
//! again is dead-lettered again beside it: a replay publishes each message
//! once, skipping the later dead letters of the same message (its copies
//! from earlier replays), so a poison never multiplies. `--since` keeps a
//! later replay from repeating earlier ones at all.

use super::record::{self, DeadLetter, Filter, IdentityHeaders};
use super::DlqError;
use crate::broker::kafka::{self, headers, Producing};
use crate::config::KafkaSettings;
use crate::message::Header;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// How long reading one DLQ topic to its end may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Bounds each metadata and watermark request (a silent broker included).
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// A dead letter with what a replay needs.
pub(super) struct KafkaLetter {
    pub letter: DeadLetter,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<Header>,
    source_partition: Option<i32>,
}

/// The header `name`, compared byte for byte, as text.
fn named(headers: &[Header], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|h| h.name == name.as_bytes())
        .and_then(|h| h.value.as_deref())
        .map(record::text)
}

/// Every dead letter of the source topics' DLQs that passes `filter`, at
/// most `limit`.
pub(super) async fn read(
    settings: &KafkaSettings,
    topics: Vec<String>,
    identity: IdentityHeaders,
    filter: Filter,
    limit: usize,
) -> Result<Vec<KafkaLetter>, DlqError> {
    // A group of its own that never commits: reading moves nothing.
    let config = kafka::reader(settings, "dedupq-dlq-reader");
    let suffix = settings.dlq_suffix.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let mut out = Vec::new();
        for topic in topics {
            let dlq = format!("{topic}{suffix}");
            let names = Names {
                source: &topic,
                dlq: &dlq,
                identity: &identity,
            };
            read_topic(&consumer, &names, &filter, limit, &mut out)?;
        }
        Ok(out)
    })
    .await
    .map_err(|e| DlqError::Reader(e.to_string()))?
}

/// The topic being read, the one it belongs to, and the identity headers.
struct Names<'a> {
    source: &'a str,
    dlq: &'a str,
    identity: &'a IdentityHeaders,
}

fn read_topic(
    consumer: &BaseConsumer,
    names: &Names<'_>,
    filter: &Filter,
    limit: usize,
    out: &mut Vec<KafkaLetter>,
) -> Result<(), DlqError> {
    let dlq = names.dlq;
    let metadata = consumer.fetch_metadata(Some(dlq), METADATA_TIMEOUT)?;
    let Some(topic) = metadata.topics().first().filter(|t| t.error().is_none()) else {
        return Err(DlqError::NoTopic(dlq.to_string()));
    };
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    for p in topic.partitions() {
        let (low, high) = consumer.fetch_watermarks(dlq, p.id(), METADATA_TIMEOUT)?;
        if high > low {
            tpl.add_partition_offset(dlq, p.id(), Offset::Offset(low))?;
            ends.push((p.id(), high));
        }
    }
    if ends.is_empty() {
        return Ok(());
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + READ_TIMEOUT;
    while !ends.is_empty() && out.len() < limit {
        if Instant::now() > deadline {
            return Err(DlqError::Reader(format!(
                "{dlq} was not read to its end in {READ_TIMEOUT:?}"
            )));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(200)) else {
            // Nothing more came: a partition whose position reached its end
            // (past control records or compacted gaps) is done.
            let position = consumer.position()?;
            ends.retain(
                |&(p, high)| match position.find_partition(dlq, p).map(|e| e.offset()) {
                    Some(Offset::Offset(at)) => at < high,
                    _ => true,
                },
            );
            continue;
        };
        let m = polled?;
        let (partition, offset) = (m.partition(), m.offset());
        let Some(&(_, high)) = ends.iter().find(|(p, _)| *p == partition) else {
            continue;
        };
        if offset < high {
            let letter = letter(&m, names);
            if filter.matches(&letter.letter) {
                out.push(letter);
            }
        }
        if offset + 1 >= high {
            ends.retain(|&(p, _)| p != partition);
        }
    }
    Ok(())
}

fn letter(m: &rdkafka::message::BorrowedMessage<'_>, names: &Names<'_>) -> KafkaLetter {
    let headers = headers::of(m);
    let get = |name: &str| named(&headers, name);
    let first_seen = get(record::FIRST_SEEN)
        .and_then(|t| record::time(&t))
        .or_else(|| {
            m.timestamp()
                .to_millis()
                .and_then(chrono::DateTime::from_timestamp_millis)
        });
    let letter = DeadLetter {
        location: format!("{}[{}]@{}", m.topic(), m.partition(), m.offset()),
        reason: get(record::REASON),
        tenant: get(record::TENANT).or_else(|| names.identity.tenant.as_deref().and_then(get)),
        key: get(record::KEY).or_else(|| get(&names.identity.key)),
        first_seen,
        source: Some(get(record::SOURCE_TOPIC).unwrap_or_else(|| names.source.to_string())),
        detail: get(record::DETAIL),
        bytes: m.payload_len(),
        unreadable: None,
        replay: None,
    };
    KafkaLetter {
        source_partition: get(record::SOURCE_PARTITION).and_then(|p| p.parse().ok()),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec),
        headers,
        letter,
    }
}

impl KafkaLetter {
    /// The headers the message had, without the ones dedupq added.
    fn original_headers(&self) -> Vec<Header> {
        self.headers
            .iter()
            .filter(|h| !h.name.starts_with(record::DIAGNOSTIC_PREFIX.as_bytes()))
            .cloned()
            .collect()
    }

    /// What a replay would publish: the topic, partition, key, payload and
    /// original headers, as one digest.
    fn message_digest(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let mut part = |bytes: Option<&[u8]>| match bytes {
            Some(b) => {
                h.update([1]);
                h.update((b.len() as u64).to_be_bytes());
                h.update(b);
            }
            None => h.update([0]),
        };
        part(self.letter.source.as_deref().map(str::as_bytes));
        let partition = self.source_partition.map(i32::to_be_bytes);
        part(partition.as_ref().map(|p| p.as_slice()));
        part(self.key.as_deref());
        part(self.payload.as_deref());
        for header in self.original_headers() {
            part(Some(&header.name));
            part(header.value.as_deref());
        }
        h.finalize().into()
    }
}

/// Marks every letter that holds the same message as an earlier one (the
/// dead letter of an earlier replay's copy, or the same message sent and
/// refused twice): a replay publishes one of them. The marked ones say
/// which letter is replayed instead.
pub(super) fn skip_repeats(letters: &mut [KafkaLetter]) {
    let mut first: std::collections::HashMap<[u8; 32], String> = Default::default();
    for l in letters.iter_mut() {
        match first.entry(l.message_digest()) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(l.letter.location.clone());
            }
            std::collections::hash_map::Entry::Occupied(o) => {
                l.letter.replay = Some(format!(
                    "skipped: the same message as {} (a copy from an earlier replay), which is replayed",
                    o.get()
                ));
            }
        }
    }
}

/// Publishes each letter not marked by [`skip_repeats`] to its source
/// topic and partition with the original key, payload and headers (the
/// `dedupq-*` ones dropped), and records what happened on the letter.
pub(super) async fn replay(
    settings: &KafkaSettings,
    letters: &mut [KafkaLetter],
) -> Result<(), DlqError> {
    // Acknowledged by every in-sync replica, never duplicated by a retry,
    // and each record bounded by kafka.produce_timeout.
    let producer: FutureProducer = kafka::producer(settings, Producing::Replay).create()?;
    for l in letters.iter_mut().filter(|l| l.letter.replay.is_none()) {
        let topic = l.letter.source.clone().unwrap_or_default();
        let original = l.original_headers();
        let mut rec: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&topic).headers(headers::owned(&original));
        if let Some(k) = &l.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(p) = &l.payload {
            rec = rec.payload(p.as_slice());
        }
        if let Some(p) = l.source_partition {
            rec = rec.partition(p);
        }
        l.letter.replay = Some(match producer.send(rec, settings.produce_timeout).await {
            Ok(d) => format!("replayed to {topic}[{}]@{}", d.partition, d.offset),
            Err((e, _)) => format!("failed: {e}"),
        });
    }
    Ok(())
}

/// What a dry run says for each letter.
pub(super) fn plan(letters: &mut [KafkaLetter]) {
    for l in letters.iter_mut().filter(|l| l.letter.replay.is_none()) {
        let to = l.letter.source.as_deref().unwrap_or("-");
        l.letter.replay = Some(match l.source_partition {
            Some(p) => format!("would replay to {to}[{p}]"),
            None => format!("would replay to {to}"),
        });
    }
}

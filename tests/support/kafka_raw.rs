//! Kafka records whose header names and values are arbitrary bytes, through
//! dedupq's own header codec (`dedupq::broker::kafka::headers`): rdkafka's
//! safe API takes header names as `&str` and unwraps `CStr::to_str()` on
//! them when reading, so a name that is not UTF-8 can neither be produced
//! nor read through it (reading one panics). librdkafka hands header names
//! back NUL-terminated: a name containing a NUL byte reads back cut at it.

use super::kafka::brokers;
use super::unique;
use dedupq::broker::kafka::{self, headers};
use dedupq::config::KafkaSettings;
use dedupq::message::Header;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// A header as bytes; `None` is a header with a null value.
pub type RawHeader = (Vec<u8>, Option<Vec<u8>>);

/// A record read back with everything as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// In the order they were produced; duplicate names are kept.
    pub headers: Vec<RawHeader>,
}

/// Produces one record with header names and values as given (bytes, in
/// order, duplicates allowed) to `partition` (or any), waits for the
/// broker's acknowledgement and returns `(partition, offset)`.
pub async fn produce_raw(
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    payload: &[u8],
    list: &[(&[u8], Option<&[u8]>)],
) -> (i32, i64) {
    let list: Vec<Header> = list
        .iter()
        .map(|(name, value)| Header {
            name: name.to_vec(),
            value: value.map(<[u8]>::to_vec),
        })
        .collect();
    let producer: FutureProducer = kafka::client(&KafkaSettings::at(&brokers()), "dedupq-test")
        .set("acks", "all")
        .set("enable.idempotence", "true")
        // The broker's default limit (1 MiB + 12) rather than the client's
        // 1,000,000: tests produce records up to what a broker accepts.
        .set("message.max.bytes", "1048588")
        .create()
        .expect("raw producer");
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
        .payload(payload)
        .headers(headers::owned(&list));
    if let Some(p) = partition {
        record = record.partition(p);
    }
    if let Some(k) = key {
        record = record.key(k);
    }
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map(|d| (d.partition, d.offset))
        .unwrap_or_else(|(e, _)| panic!("delivery to {topic} failed: {e}"))
}

/// Reads `topic` (every partition) from the beginning until `count`
/// records arrived, with header names and values as bytes.
pub async fn read_raw(
    topic: &str,
    partitions: i32,
    count: usize,
    limit: Duration,
) -> Vec<RawRecord> {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || read_blocking(&topic, partitions, count, limit))
        .await
        .expect("raw reader thread")
}

fn read_blocking(topic: &str, partitions: i32, count: usize, limit: Duration) -> Vec<RawRecord> {
    let consumer: BaseConsumer =
        kafka::reader(&KafkaSettings::at(&brokers()), &unique("raw-reader"))
            .create()
            .expect("raw reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition offset");
    }
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    while out.len() < count {
        assert!(
            Instant::now() < deadline,
            "read {} of {count} records from {topic} in {limit:?}",
            out.len()
        );
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push(raw_record(&m)),
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    out
}

fn raw_record(m: &BorrowedMessage<'_>) -> RawRecord {
    RawRecord {
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec),
        headers: raw_headers(m),
    }
}

/// The record's headers as (name, value) bytes.
pub fn raw_headers(m: &BorrowedMessage<'_>) -> Vec<RawHeader> {
    headers::of(m)
        .into_iter()
        .map(|h| (h.name, h.value))
        .collect()
}

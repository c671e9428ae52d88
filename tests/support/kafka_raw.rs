//! Kafka records whose header names and values are arbitrary bytes.
//!
//! rdkafka's safe API takes header names as `&str` (`OwnedHeaders::insert`)
//! and unwraps `CStr::to_str()` on them when reading (`BorrowedHeaders`),
//! so a name that is not UTF-8 can neither be produced nor read through it
//! (reading one panics). Both directions here go through librdkafka's C API
//! (re-exported by rdkafka as `rdkafka::bindings`, so it is always the
//! librdkafka that rdkafka itself links). librdkafka hands header names back
//! NUL-terminated: a name containing a NUL byte reads back cut at it.

use super::kafka::brokers;
use super::unique;
use rdkafka::bindings as rdsys;
use rdkafka::bindings::rd_kafka_vtype_t::*;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr;
use std::sync::Mutex;
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

/// Remembers the broker's delivery reports.
#[derive(Default)]
struct Reports(Mutex<Vec<Result<(i32, i64), KafkaError>>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let report = match result {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.clone()),
        };
        self.0.lock().unwrap().push(report);
    }
}

/// Produces one record with header names and values as given (bytes, in
/// order, duplicates allowed) to `partition` (or any), waits for the
/// broker's acknowledgement and returns `(partition, offset)`.
pub async fn produce_raw(
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    payload: &[u8],
    headers: &[(&[u8], Option<&[u8]>)],
) -> (i32, i64) {
    let topic = topic.to_string();
    let key = key.map(<[u8]>::to_vec);
    let payload = payload.to_vec();
    let headers: Vec<RawHeader> = headers
        .iter()
        .map(|(n, v)| (n.to_vec(), v.map(<[u8]>::to_vec)))
        .collect();
    tokio::task::spawn_blocking(move || {
        produce_blocking(&topic, partition, key.as_deref(), &payload, &headers)
    })
    .await
    .expect("raw producer thread")
}

fn produce_blocking(
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    payload: &[u8],
    headers: &[RawHeader],
) -> (i32, i64) {
    let producer: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("acks", "all")
        .set("enable.idempotence", "true")
        // The broker's default limit (1 MiB + 12) rather than the client's
        // 1,000,000: tests produce records up to what a broker accepts.
        .set("message.max.bytes", "1048588")
        .create_with_context(Reports::default())
        .expect("raw producer");
    let topic_c = CString::new(topic).expect("topic name without NUL");
    let native = native_headers(headers);
    let (key_ptr, key_len) = key.map_or((ptr::null_mut(), 0), |k| {
        (k.as_ptr() as *mut c_void, k.len())
    });
    // SAFETY: every pointer outlives the call; RD_KAFKA_MSG_F_COPY makes
    // librdkafka copy key and payload; on success it owns `native`.
    let err = unsafe {
        rdsys::rd_kafka_producev(
            producer.client().native_ptr(),
            RD_KAFKA_VTYPE_TOPIC,
            topic_c.as_ptr(),
            RD_KAFKA_VTYPE_PARTITION,
            partition.unwrap_or(-1),
            RD_KAFKA_VTYPE_MSGFLAGS,
            rdsys::RD_KAFKA_MSG_F_COPY,
            RD_KAFKA_VTYPE_VALUE,
            payload.as_ptr() as *mut c_void,
            payload.len(),
            RD_KAFKA_VTYPE_KEY,
            key_ptr,
            key_len,
            RD_KAFKA_VTYPE_HEADERS,
            native,
            RD_KAFKA_VTYPE_END,
        )
    };
    if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        // SAFETY: not taken over by librdkafka when producev fails.
        unsafe { rdsys::rd_kafka_headers_destroy(native) };
        panic!(
            "rd_kafka_producev to {topic}: {:?}",
            RDKafkaErrorCode::from(err)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        producer.poll(Duration::from_millis(100));
        if let Some(report) = producer.context().0.lock().unwrap().pop() {
            return report.unwrap_or_else(|e| panic!("delivery to {topic} failed: {e}"));
        }
        assert!(
            Instant::now() < deadline,
            "no delivery report from {topic} in 30 s"
        );
    }
}

/// A librdkafka header list holding copies of `headers`.
fn native_headers(headers: &[RawHeader]) -> *mut rdsys::rd_kafka_headers_t {
    // SAFETY: a fresh list; each add copies name and value.
    unsafe {
        let list = rdsys::rd_kafka_headers_new(headers.len().max(1));
        for (name, value) in headers {
            let (value_ptr, value_len) = value.as_ref().map_or((ptr::null(), 0), |v| {
                (v.as_ptr() as *const c_void, v.len() as isize)
            });
            let err = rdsys::rd_kafka_header_add(
                list,
                name.as_ptr() as *const c_char,
                name.len() as isize,
                value_ptr,
                value_len,
            );
            assert_eq!(
                err,
                rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
                "rd_kafka_header_add"
            );
        }
        list
    }
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
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", unique("raw-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
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

/// The record's headers through `rd_kafka_header_get_all`, which hands out
/// the name as a C string and the value as pointer and length.
pub fn raw_headers(m: &BorrowedMessage<'_>) -> Vec<RawHeader> {
    let mut list: *mut rdsys::rd_kafka_headers_t = ptr::null_mut();
    // SAFETY: the message is alive for the whole function and owns the list.
    let err = unsafe { rdsys::rd_kafka_message_headers(m.ptr(), &mut list) };
    if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || list.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for idx in 0.. {
        let (mut name, mut value, mut size) = (ptr::null(), ptr::null(), 0usize);
        // SAFETY: `idx` past the end returns an error and touches nothing.
        let err =
            unsafe { rdsys::rd_kafka_header_get_all(list, idx, &mut name, &mut value, &mut size) };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            break;
        }
        // SAFETY: librdkafka returns a NUL-terminated name and a value of
        // `size` bytes (or null), both alive as long as the message.
        let header = unsafe {
            (
                CStr::from_ptr(name).to_bytes().to_vec(),
                (!value.is_null())
                    .then(|| std::slice::from_raw_parts(value as *const u8, size).to_vec()),
            )
        };
        out.push(header);
    }
    out
}

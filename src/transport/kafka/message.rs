//! A fetched Kafka record, copied out of librdkafka's buffer, as the engine
//! and the dead-letter producer need it. Header names and values are read
//! as bytes through librdkafka's own API: rdkafka's safe header iterator
//! unwraps a UTF-8 conversion of every name, so one record with a
//! non-UTF-8 name would panic the consumer on every restart.

use super::ledger::Lane;
use crate::engine::{Header, Incoming, Source};
use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedMessage, Message};
use std::ffi::CStr;

/// The header a Kafka producer may set to give the payload's media type.
const CONTENT_TYPE: &str = "content-type";

/// A record this member owns until its outcome is durable.
#[derive(Debug, Clone)]
pub struct Held {
    pub lane: Lane,
    pub offset: i64,
    /// The record's Kafka key, kept for its dead letter.
    pub key: Option<Vec<u8>>,
    /// The engine's identity hint (`Parser::identity_hint`): two batches of
    /// one partition run at once only if no hint is in both.
    pub hint: Option<u64>,
    pub incoming: Incoming,
}

impl Held {
    /// Never fails: missing payloads and header values become empty, and
    /// the engine decides whether that is valid.
    pub fn from_record(lane: Lane, msg: &BorrowedMessage<'_>) -> Self {
        let headers = raw_headers(msg);
        let content_type = headers
            .iter()
            .find(|h| h.is(CONTENT_TYPE))
            .and_then(|h| h.value.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_string);
        let mut incoming = Incoming::new(
            Source::Kafka {
                topic: msg.topic().to_string(),
                partition: msg.partition(),
                offset: msg.offset(),
            },
            msg.payload().unwrap_or_default(),
        );
        incoming.headers = headers;
        incoming.content_type = content_type;
        Self {
            lane,
            offset: msg.offset(),
            key: msg.key().map(<[u8]>::to_vec),
            hint: None,
            incoming,
        }
    }

    /// Bytes this record holds in memory (for the buffer's byte bound).
    pub fn size(&self) -> usize {
        let headers: usize = self
            .incoming
            .headers
            .iter()
            .map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len) + 16)
            .sum();
        self.incoming.body.len() + headers + self.key.as_ref().map_or(0, Vec::len) + 128
    }
}

/// Every header of the record, names and values as bytes.
fn raw_headers(msg: &BorrowedMessage<'_>) -> Vec<Header> {
    let mut headers = std::ptr::null_mut();
    // SAFETY: `msg.ptr()` is a live message owned by the consumer for the
    // borrow's lifetime; librdkafka returns a pointer into it (or an error
    // when the record has no headers), which is only read below, before
    // the borrow ends.
    let err = unsafe { rd::rd_kafka_message_headers(msg.ptr(), &mut headers) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || headers.is_null() {
        return Vec::new();
    }
    // SAFETY: as above; `headers` is valid while `msg` is.
    let count = unsafe { rd::rd_kafka_header_cnt(headers) };
    let mut out = Vec::with_capacity(count);
    for idx in 0..count {
        let mut name = std::ptr::null();
        let mut value = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: idx < count; the out-pointers are written by librdkafka
        // and point into `headers` (name NUL-terminated, value `size` bytes
        // or null).
        let err =
            unsafe { rd::rd_kafka_header_get_all(headers, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: see above.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes().to_vec();
        let value = (!value.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec());
        out.push(Header { name, value });
    }
    out
}

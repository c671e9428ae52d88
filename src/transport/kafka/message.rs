//! A fetched Kafka record, copied out of librdkafka's buffer, as the engine
//! and the dead-letter producer need it. Header names and values are read
//! as bytes (`broker::kafka::headers`): one record with a non-UTF-8 name
//! would otherwise panic the consumer on every restart.

use super::ledger::Lane;
use crate::broker::kafka::headers;
use crate::engine::{Incoming, Source};
use rdkafka::message::{BorrowedMessage, Message};

/// The header a Kafka producer may set to give the payload's media type.
const CONTENT_TYPE: &str = "content-type";

/// A record this member owns until its outcome is durable.
#[derive(Debug, Clone)]
pub(super) struct Held {
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
    pub(super) fn from_record(lane: Lane, msg: &BorrowedMessage<'_>) -> Self {
        let headers = headers::of(msg);
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
    pub(super) fn size(&self) -> usize {
        let headers: usize = self
            .incoming
            .headers
            .iter()
            .map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len) + 16)
            .sum();
        self.incoming.body.len() + headers + self.key.as_ref().map_or(0, Vec::len) + 128
    }
}

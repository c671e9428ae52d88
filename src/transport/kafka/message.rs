//! A fetched Kafka record, copied out of librdkafka's buffer, as the engine
//! and the dead-letter producer need it.

use super::ledger::Lane;
use crate::engine::{Incoming, Source};
use chrono::Utc;
use rdkafka::message::{BorrowedMessage, Headers, Message};

/// A record this member owns until its outcome is durable.
#[derive(Debug, Clone)]
pub struct Held {
    pub lane: Lane,
    pub offset: i64,
    /// The record's Kafka key, kept for its dead letter.
    pub key: Option<Vec<u8>>,
    pub incoming: Incoming,
}

impl Held {
    /// Never fails: missing payloads and header values become empty, and
    /// the engine decides whether that is valid.
    pub fn from_record(lane: Lane, msg: &BorrowedMessage<'_>) -> Self {
        let headers = msg
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        let incoming = Incoming {
            headers,
            body: msg.payload().unwrap_or_default().to_vec(),
            source: Source::Kafka {
                topic: msg.topic().to_string(),
                partition: msg.partition(),
                offset: msg.offset(),
            },
            received_at: Utc::now(),
        };
        Self {
            lane,
            offset: msg.offset(),
            key: msg.key().map(<[u8]>::to_vec),
            incoming,
        }
    }
}

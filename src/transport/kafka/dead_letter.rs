//! The dead-letter record of a message: the original key, payload and
//! headers, plus headers saying why and where it came from.

use super::message::Held;
use super::outbox::Record;
use crate::engine::{DeadLetterReason, Decision, Source};

/// Headers dedupq adds to a dead letter (the original headers follow).
pub mod header {
    pub const REASON: &str = "dedupq-reason";
    pub const DETAIL: &str = "dedupq-detail";
    pub const OUTCOME: &str = "dedupq-outcome";
    pub const TENANT: &str = "dedupq-tenant";
    pub const KEY: &str = "dedupq-key";
    pub const FINGERPRINT: &str = "dedupq-fingerprint";
    pub const SOURCE_TOPIC: &str = "dedupq-source-topic";
    pub const SOURCE_PARTITION: &str = "dedupq-source-partition";
    pub const SOURCE_OFFSET: &str = "dedupq-source-offset";
    pub const FIRST_SEEN: &str = "dedupq-first-seen";
}

pub fn record(
    held: &Held,
    decision: &Decision,
    reason: &DeadLetterReason,
    detail: &str,
    suffix: &str,
) -> Record {
    let (topic, partition, offset) = match &held.incoming.source {
        Source::Kafka {
            topic,
            partition,
            offset,
        } => (topic.as_str(), *partition, *offset),
        _ => (
            held.lane.tp.topic.as_str(),
            held.lane.tp.partition,
            held.offset,
        ),
    };
    let mut headers: Vec<(String, Vec<u8>)> = vec![
        (header::REASON.into(), reason.label().into()),
        (header::DETAIL.into(), detail.into()),
        (header::OUTCOME.into(), decision.outcome.label().into()),
        (header::SOURCE_TOPIC.into(), topic.into()),
        (
            header::SOURCE_PARTITION.into(),
            partition.to_string().into(),
        ),
        (header::SOURCE_OFFSET.into(), offset.to_string().into()),
        (
            header::FIRST_SEEN.into(),
            held.incoming.received_at.to_rfc3339().into(),
        ),
    ];
    if let Some(id) = &decision.identity {
        headers.push((header::TENANT.into(), id.tenant.as_str().into()));
        headers.push((header::KEY.into(), id.key.as_str().into()));
    }
    if let Some(fp) = &decision.fingerprint {
        let value = format!("v{}:{}", fp.version, fp.hex());
        headers.push((header::FINGERPRINT.into(), value.into()));
    }
    headers.extend(held.incoming.headers.iter().cloned());
    Record {
        topic: format!("{topic}{suffix}"),
        key: held.key.clone(),
        payload: held.incoming.body.clone(),
        headers,
    }
}

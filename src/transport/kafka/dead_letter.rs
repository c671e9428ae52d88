//! The dead-letter record of a message: the original key, payload and
//! headers, plus headers saying why and where it came from, cut to fit the
//! producer's size limit so that it can always be produced.

use super::message::Held;
use super::outbox::Record;
use crate::engine::{DeadLetterReason, Decision, Header, Source};
use crate::transport::envelope::{self, Origin};

pub(super) fn record(
    held: &Held,
    decision: &Decision,
    reason: &DeadLetterReason,
    detail: &str,
    suffix: &str,
    max_bytes: usize,
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
    let origin = Origin::Kafka {
        topic,
        partition,
        offset,
    };
    let own =
        envelope::dead_letter_headers(decision, reason, detail, &origin, held.incoming.received_at);
    let key_len = held.key.as_ref().map_or(0, Vec::len);
    let fitted = envelope::fit(
        &held.incoming.body,
        &own,
        &held.incoming.headers,
        |h: &Header| h.name.len() + h.value.as_ref().map_or(0, Vec::len) + 8,
        max_bytes.saturating_sub(key_len),
    );
    let headers = own
        .into_iter()
        .chain(fitted.extra)
        .map(|(n, v)| Header::new(n, v))
        .chain(fitted.original_headers)
        .collect();
    Record {
        topic: format!("{topic}{suffix}"),
        key: held.key.clone(),
        payload: fitted.payload,
        headers,
    }
}

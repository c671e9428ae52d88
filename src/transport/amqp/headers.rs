//! RabbitMQ's side of dedupq's headers: reading the trip count and first
//! sighting back, encoding header lists as field tables, and the
//! properties of a republished message. The names live in
//! `transport::envelope`.

use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use std::time::Duration;

pub(crate) use crate::transport::envelope::header::{FIRST_SEEN, TRIPS, USER_ID};

/// Broker-written dead-letter history: dropped on republish so it does not
/// grow with every trip (`dedupq-trips` is the count that matters).
const BROKER_HISTORY: [&str; 4] = [
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
];

/// Persistent: survives a broker restart in a durable queue.
const PERSISTENT: u8 = 2;

/// The `dedupq-trips` count of a delivery (any integer type, or digits as
/// text); 0 when absent, unreadable or negative.
pub(crate) fn trips(table: Option<&FieldTable>) -> u32 {
    let Some(value) = table.and_then(|t| t.inner().get(TRIPS)) else {
        return 0;
    };
    let n: i64 = match value {
        AMQPValue::LongLongInt(n) => *n,
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0),
        _ => 0,
    };
    n.clamp(0, i64::from(u32::MAX)) as u32
}

/// The `dedupq-first-seen` time of a delivery, if it carries a readable
/// one (written on every trip through the delay queue).
pub(crate) fn first_seen(table: Option<&FieldTable>) -> Option<DateTime<Utc>> {
    match table?.inner().get(FIRST_SEEN)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
            .ok()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc)),
        _ => None,
    }
}

/// A header value as AMQP text (a long string).
pub(crate) fn text(value: impl Into<Vec<u8>>) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// The original properties for a republish (delay queue or dead letter):
/// everything kept except `expiration` and `user_id`, plus `extra` headers.
pub(crate) fn republished(
    original: &BasicProperties,
    extra: &crate::transport::envelope::Headers,
) -> BasicProperties {
    let mut table = original.headers().clone().unwrap_or_default();
    let mut entries = table.inner().clone();
    for name in BROKER_HISTORY {
        entries.remove(name);
    }
    table = FieldTable::from(entries);
    if let Some(user) = original.user_id() {
        table.insert(USER_ID.into(), text(user.as_str()));
    }
    for (name, value) in extra {
        table.insert((*name).into(), text(value.as_bytes()));
    }
    let mut p = BasicProperties::default()
        .with_headers(table)
        .with_delivery_mode(PERSISTENT);
    let o = original;
    macro_rules! keep {
        ($get:ident, $with:ident) => {
            if let Some(v) = o.$get().clone() {
                p = p.$with(v);
            }
        };
    }
    keep!(content_type, with_content_type);
    keep!(content_encoding, with_content_encoding);
    keep!(priority, with_priority);
    keep!(correlation_id, with_correlation_id);
    keep!(reply_to, with_reply_to);
    keep!(message_id, with_message_id);
    keep!(timestamp, with_timestamp);
    keep!(kind, with_type);
    keep!(app_id, with_app_id);
    keep!(cluster_id, with_cluster_id);
    p
}

/// A per-message TTL, in whole milliseconds as RabbitMQ wants it.
pub(crate) fn expiration(delay: Duration) -> ShortString {
    delay.as_millis().max(1).to_string().into()
}

/// dedupq's headers (all text) into a field table.
pub(crate) fn table_of(headers: &crate::transport::envelope::Headers) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        table.insert((*name).into(), text(value.as_bytes()));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_republish_keeps_the_message_but_not_its_ttl_user_or_broker_history() {
        let mut t = FieldTable::default();
        t.insert("client-id".into(), text("acme"));
        t.insert("x-death".into(), AMQPValue::FieldArray(Default::default()));
        let original = BasicProperties::default()
            .with_headers(t)
            .with_expiration("5".into())
            .with_user_id("alice".into())
            .with_correlation_id("c-1".into());
        let p = republished(&original, &vec![(TRIPS, "3".to_string())]);
        assert_eq!(p.expiration(), &None);
        assert_eq!(p.user_id(), &None);
        assert_eq!(p.correlation_id().as_ref().map(|c| c.as_str()), Some("c-1"));
        let h = p.headers().as_ref().unwrap();
        assert!(!h.contains_key("x-death"));
        assert!(h.contains_key("client-id"));
        assert_eq!(trips(Some(h)), 3);
        assert_eq!(h.inner().get(USER_ID), Some(&text("alice")));
    }

    #[test]
    fn a_garbage_trip_header_counts_as_zero_and_a_negative_one_too() {
        let mut t = FieldTable::default();
        t.insert(TRIPS.into(), AMQPValue::Boolean(true));
        assert_eq!(trips(Some(&t)), 0);
        t.insert(TRIPS.into(), AMQPValue::LongLongInt(-5));
        assert_eq!(trips(Some(&t)), 0);
    }
}

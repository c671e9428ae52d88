//! The headers and properties dedupq writes: trip counting for the delay
//! queue, dead-letter records, replies. Names live here only.

use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use std::time::Duration;

/// Trips through the delay queue so far.
pub const TRIPS: &str = "dedupq-trips";
/// RFC 3339 time dedupq first received the message.
pub const FIRST_SEEN: &str = "dedupq-first-seen";
/// Dead letters: low-cardinality reason label, and human detail.
pub const REASON: &str = "dedupq-reason";
pub const DETAIL: &str = "dedupq-detail";
pub const TENANT: &str = "dedupq-tenant";
pub const KEY: &str = "dedupq-key";
pub const FINGERPRINT: &str = "dedupq-fingerprint";
pub const SOURCE_QUEUE: &str = "dedupq-source-queue";
pub const DELIVERY_TAG: &str = "dedupq-delivery-tag";
/// The producer's `user_id` property, which the broker would refuse on a
/// republish under dedupq's own user.
pub const USER_ID: &str = "dedupq-user-id";
/// Replies (also carrying tenant and key): the key's status (`done`,
/// `failed`), the handler's status code, and the outcome label
/// (`processed`, `duplicate`, …).
pub const STATUS: &str = "dedupq-status";
pub const RESULT_STATUS: &str = "dedupq-result-status";
pub const OUTCOME: &str = "dedupq-outcome";

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

pub fn trips(table: Option<&FieldTable>) -> u32 {
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

pub fn first_seen(table: Option<&FieldTable>) -> Option<DateTime<Utc>> {
    match table?.inner().get(FIRST_SEEN)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
            .ok()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc)),
        _ => None,
    }
}

pub fn text(value: impl Into<Vec<u8>>) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

pub fn int(value: i64) -> AMQPValue {
    AMQPValue::LongLongInt(value)
}

/// The original properties for a republish (delay queue or dead letter):
/// everything kept except `expiration` and `user_id`, plus `extra` headers.
pub fn republished(
    original: &BasicProperties,
    extra: Vec<(&'static str, AMQPValue)>,
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
        table.insert(name.into(), value);
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
pub fn expiration(delay: Duration) -> ShortString {
    delay.as_millis().max(1).to_string().into()
}

pub fn rfc3339(t: DateTime<Utc>) -> AMQPValue {
    text(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
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
        let p = republished(&original, vec![(TRIPS, int(3))]);
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
        t.insert(TRIPS.into(), int(-5));
        assert_eq!(trips(Some(&t)), 0);
    }
}

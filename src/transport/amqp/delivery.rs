//! A RabbitMQ delivery as the engine sees it. `redelivered` is kept for
//! logs only: producers duplicate too, so every delivery is claimed.

use super::headers;
use crate::engine::{Header, Incoming, Source};
use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::AMQPValue;
use lapin::{Acker, BasicProperties};

/// What the transport keeps of a delivery besides its `Incoming`: enough
/// to ack it, reply to it, retry it or dead-letter it.
pub(super) struct Meta {
    pub properties: BasicProperties,
    pub acker: Acker,
    pub delivery_tag: u64,
    pub redelivered: bool,
    /// Trips through the delay queue so far.
    pub trips: u32,
    /// When dedupq first saw this message (kept across delay-queue trips).
    pub first_seen: DateTime<Utc>,
}

/// Splits a delivery into what the engine needs and what the transport
/// keeps.
/// `key_header` is where the engine looks for the key (`identity.key_header`);
/// the `message_id` property is the fallback. `retry_limit` is
/// `amqp.max_redeliveries`: the trips a message may make through the delay
/// queue.
pub(super) fn receive(
    queue: &str,
    key_header: &str,
    retry_limit: u32,
    delivery: Delivery,
) -> (Incoming, Meta) {
    let Delivery {
        delivery_tag,
        redelivered,
        properties,
        data,
        acker,
        ..
    } = delivery;
    let received_at = Utc::now();
    let mut list = header_list(&properties);
    if !list.iter().any(|h| h.is(key_header)) {
        if let Some(id) = properties.message_id() {
            list.push(Header::new(key_header, id.as_str()));
        }
    }
    let table = properties.headers().as_ref();
    let meta = Meta {
        trips: headers::trips(table),
        first_seen: headers::first_seen(table).unwrap_or(received_at),
        properties,
        acker,
        delivery_tag,
        redelivered,
    };
    let mut incoming = Incoming::new(
        Source::Amqp {
            queue: queue.to_string(),
            delivery_tag,
        },
        data,
    );
    incoming.headers = list;
    incoming.content_type = meta
        .properties
        .content_type()
        .as_ref()
        .map(|c| c.as_str().to_string());
    incoming.received_at = received_at;
    incoming.retries = meta.trips;
    incoming.retry_limit = Some(retry_limit);
    (incoming, meta)
}

/// Headers with a text form (strings, numbers, booleans); tables, arrays
/// and the like cannot carry a tenant or key and are left out.
fn header_list(properties: &BasicProperties) -> Vec<Header> {
    let Some(table) = properties.headers() else {
        return Vec::new();
    };
    table
        .into_iter()
        .filter_map(|(name, value)| Some(Header::new(name.as_str(), value_bytes(value)?)))
        .collect()
}

fn value_bytes(value: &AMQPValue) -> Option<Vec<u8>> {
    let text = match value {
        AMQPValue::LongString(s) => return Some(s.as_bytes().to_vec()),
        AMQPValue::ShortString(s) => return Some(s.as_str().as_bytes().to_vec()),
        AMQPValue::ByteArray(b) => return Some(b.as_slice().to_vec()),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        _ => return None,
    };
    Some(text.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldTable, LongString};

    fn delivery(properties: BasicProperties) -> Delivery {
        let mut d = Delivery::mock(7, "".into(), "q".into(), false, b"{}".to_vec());
        d.properties = properties;
        d
    }

    #[test]
    fn the_message_id_is_the_key_when_no_key_header_is_present() {
        let (incoming, _) = receive(
            "q",
            "idempotency-key",
            20,
            delivery(BasicProperties::default().with_message_id("m-1".into())),
        );
        assert_eq!(incoming.header("idempotency-key"), Some(&b"m-1"[..]));
    }

    #[test]
    fn a_key_header_wins_over_the_message_id_and_numbers_become_text() {
        let mut table = FieldTable::default();
        table.insert(
            "Idempotency-Key".into(),
            AMQPValue::LongString(LongString::from("h-1")),
        );
        table.insert("client-id".into(), AMQPValue::LongLongInt(42));
        table.insert(
            "nested".into(),
            AMQPValue::FieldTable(FieldTable::default()),
        );
        let props = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(table);
        let (incoming, meta) = receive("q", "idempotency-key", 20, delivery(props));
        assert_eq!(incoming.header("idempotency-key"), Some(&b"h-1"[..]));
        assert_eq!(incoming.header("client-id"), Some(&b"42"[..]));
        assert_eq!(incoming.header("nested"), None);
        assert_eq!(meta.trips, 0);
    }
}

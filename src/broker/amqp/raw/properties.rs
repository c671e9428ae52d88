//! The basic-class content properties, every string as bytes, in the
//! order and with the flag bits of the 0-9-1 spec.

use super::codec::{FieldValue, Reader, Table, Writer};
use super::RawAmqpError;

/// A message's properties as the broker stores them; `None` is a property
/// that is not set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawProperties {
    /// `content_type`.
    pub content_type: Option<Vec<u8>>,
    /// `content_encoding`.
    pub content_encoding: Option<Vec<u8>>,
    /// The header table, in wire order.
    pub headers: Option<Table>,
    /// `delivery_mode` (2: persistent).
    pub delivery_mode: Option<u8>,
    /// `priority`.
    pub priority: Option<u8>,
    /// `correlation_id`.
    pub correlation_id: Option<Vec<u8>>,
    /// `reply_to`.
    pub reply_to: Option<Vec<u8>>,
    /// `expiration` (milliseconds, as text).
    pub expiration: Option<Vec<u8>>,
    /// `message_id`.
    pub message_id: Option<Vec<u8>>,
    /// `timestamp`, seconds since the epoch.
    pub timestamp: Option<u64>,
    /// The `type` property.
    pub kind: Option<Vec<u8>>,
    /// RabbitMQ refuses a `user_id` other than the connection's user.
    pub user_id: Option<Vec<u8>>,
    /// `app_id`.
    pub app_id: Option<Vec<u8>>,
}

/// Flag bits, highest first, in property order.
const CONTENT_TYPE: u16 = 1 << 15;
const CONTENT_ENCODING: u16 = 1 << 14;
const HEADERS: u16 = 1 << 13;
const DELIVERY_MODE: u16 = 1 << 12;
const PRIORITY: u16 = 1 << 11;
const CORRELATION_ID: u16 = 1 << 10;
const REPLY_TO: u16 = 1 << 9;
const EXPIRATION: u16 = 1 << 8;
const MESSAGE_ID: u16 = 1 << 7;
const TIMESTAMP: u16 = 1 << 6;
const TYPE: u16 = 1 << 5;
const USER_ID: u16 = 1 << 4;
const APP_ID: u16 = 1 << 3;
const CLUSTER_ID: u16 = 1 << 2;

impl RawProperties {
    /// A header (table entry) by exact key bytes.
    pub fn header(&self, key: &[u8]) -> Option<&FieldValue> {
        self.headers
            .as_ref()?
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// What lapin cannot parse in these properties, if anything: it reads
    /// every short-string property and every table key (nested ones too)
    /// as UTF-8, and one that is not fails its whole connection.
    pub fn unreadable(&self) -> Option<String> {
        let shorts = [
            ("content_type", &self.content_type),
            ("content_encoding", &self.content_encoding),
            ("correlation_id", &self.correlation_id),
            ("reply_to", &self.reply_to),
            ("expiration", &self.expiration),
            ("message_id", &self.message_id),
            ("type", &self.kind),
            ("user_id", &self.user_id),
            ("app_id", &self.app_id),
        ];
        for (name, value) in shorts {
            if let Some(v) = value.as_deref().filter(|v| std::str::from_utf8(v).is_err()) {
                return Some(format!("{name} is not UTF-8: {}", v.escape_ascii()));
            }
        }
        self.headers.as_deref().and_then(unreadable_key)
    }

    pub(super) fn encode(&self, w: &mut Writer) -> Result<(), RawAmqpError> {
        let mut flags = 0;
        let mut list = Writer::default();
        let mut short = |bit: u16, v: &Option<Vec<u8>>, list: &mut Writer| {
            if let Some(s) = v {
                flags |= bit;
                list.short_str(s)?;
            }
            Ok::<_, RawAmqpError>(())
        };
        short(CONTENT_TYPE, &self.content_type, &mut list)?;
        short(CONTENT_ENCODING, &self.content_encoding, &mut list)?;
        if let Some(h) = &self.headers {
            list.table(h)?;
        }
        if let Some(m) = self.delivery_mode {
            list.u8(m);
        }
        if let Some(p) = self.priority {
            list.u8(p);
        }
        short(CORRELATION_ID, &self.correlation_id, &mut list)?;
        short(REPLY_TO, &self.reply_to, &mut list)?;
        short(EXPIRATION, &self.expiration, &mut list)?;
        short(MESSAGE_ID, &self.message_id, &mut list)?;
        if let Some(t) = self.timestamp {
            list.u64(t);
        }
        short(TYPE, &self.kind, &mut list)?;
        short(USER_ID, &self.user_id, &mut list)?;
        short(APP_ID, &self.app_id, &mut list)?;
        let set = |bit: u16, present: bool| if present { bit } else { 0 };
        flags |= set(HEADERS, self.headers.is_some())
            | set(DELIVERY_MODE, self.delivery_mode.is_some())
            | set(PRIORITY, self.priority.is_some())
            | set(TIMESTAMP, self.timestamp.is_some());
        w.u16(flags).0.extend_from_slice(&list.0);
        Ok(())
    }

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<Self, RawAmqpError> {
        let flags = r.u16()?;
        if flags & 1 != 0 {
            return Err(RawAmqpError::Protocol(
                "continued property flags are not supported".into(),
            ));
        }
        let on = |bit: u16| flags & bit != 0;
        let short = |bit: u16, r: &mut Reader<'_>| -> Result<Option<Vec<u8>>, RawAmqpError> {
            on(bit).then(|| r.short_str()).transpose()
        };
        let content_type = short(CONTENT_TYPE, r)?;
        let content_encoding = short(CONTENT_ENCODING, r)?;
        let headers = on(HEADERS).then(|| r.table()).transpose()?;
        let delivery_mode = on(DELIVERY_MODE).then(|| r.u8()).transpose()?;
        let priority = on(PRIORITY).then(|| r.u8()).transpose()?;
        let correlation_id = short(CORRELATION_ID, r)?;
        let reply_to = short(REPLY_TO, r)?;
        let expiration = short(EXPIRATION, r)?;
        let message_id = short(MESSAGE_ID, r)?;
        let timestamp = on(TIMESTAMP).then(|| r.u64()).transpose()?;
        let kind = short(TYPE, r)?;
        let user_id = short(USER_ID, r)?;
        let app_id = short(APP_ID, r)?;
        short(CLUSTER_ID, r)?;
        Ok(Self {
            content_type,
            content_encoding,
            headers,
            delivery_mode,
            priority,
            correlation_id,
            reply_to,
            expiration,
            message_id,
            timestamp,
            kind,
            user_id,
            app_id,
        })
    }
}

/// The first table key (at any depth) that is not UTF-8.
fn unreadable_key(table: &[(Vec<u8>, FieldValue)]) -> Option<String> {
    table.iter().find_map(|(key, value)| {
        if std::str::from_utf8(key).is_err() {
            return Some(format!("header name is not UTF-8: {}", key.escape_ascii()));
        }
        unreadable_in(value)
    })
}

fn unreadable_in(value: &FieldValue) -> Option<String> {
    match value {
        FieldValue::Table(t) => unreadable_key(t),
        FieldValue::Array(items) => items.iter().find_map(unreadable_in),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_lapin_cannot_parse_is_named_and_everything_else_passes() {
        let fine = RawProperties {
            message_id: Some(b"m-1".to_vec()),
            headers: Some(vec![(b"k".to_vec(), FieldValue::LongStr(b"\xff".to_vec()))]),
            ..RawProperties::default()
        };
        assert_eq!(fine.unreadable(), None, "a header value may be any bytes");
        let id = RawProperties {
            message_id: Some(b"\xff\xfe-poison".to_vec()),
            ..RawProperties::default()
        };
        assert_eq!(
            id.unreadable().as_deref(),
            Some("message_id is not UTF-8: \\xff\\xfe-poison")
        );
        let nested = RawProperties {
            headers: Some(vec![(
                b"x-death".to_vec(),
                FieldValue::Array(vec![FieldValue::Table(vec![(
                    b"\xc3\x28".to_vec(),
                    FieldValue::Void,
                )])]),
            )]),
            ..RawProperties::default()
        };
        assert!(nested.unreadable().unwrap().starts_with("header name"));
    }
}

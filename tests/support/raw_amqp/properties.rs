//! The basic-class content properties, every string as bytes, in the
//! order and with the flag bits of the 0-9-1 spec.

use super::codec::{Reader, Table, Writer};
use super::RawAmqpError;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawProperties {
    pub content_type: Option<Vec<u8>>,
    pub content_encoding: Option<Vec<u8>>,
    pub headers: Option<Table>,
    pub delivery_mode: Option<u8>,
    pub priority: Option<u8>,
    pub correlation_id: Option<Vec<u8>>,
    pub reply_to: Option<Vec<u8>>,
    pub expiration: Option<Vec<u8>>,
    pub message_id: Option<Vec<u8>>,
    pub timestamp: Option<u64>,
    /// The `type` property.
    pub kind: Option<Vec<u8>>,
    /// RabbitMQ refuses a `user_id` other than the connection's user.
    pub user_id: Option<Vec<u8>>,
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
    pub fn header(&self, key: &[u8]) -> Option<&super::FieldValue> {
        self.headers
            .as_ref()?
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
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

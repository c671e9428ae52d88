//! AMQP 0-9-1 wire encoding, by hand, with every string as bytes: the
//! parts of the spec (section 4.2) a publisher and a `basic.get` reader need.

use super::RawAmqpError;

pub(super) const FRAME_METHOD: u8 = 1;
pub(super) const FRAME_HEADER: u8 = 2;
pub(super) const FRAME_BODY: u8 = 3;
pub(super) const FRAME_HEARTBEAT: u8 = 8;
pub(super) const FRAME_END: u8 = 0xCE;

/// A field-table value. Strings are bytes: the broker does not check them.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    /// `S`, a long string.
    LongStr(Vec<u8>),
    /// `I`, a signed 32-bit integer.
    Int(i32),
    /// `l`, a signed 64-bit integer.
    Long(i64),
    /// `t`.
    Bool(bool),
    /// `x`, a byte array (a RabbitMQ extension).
    Bytes(Vec<u8>),
    /// `T`, seconds since the epoch.
    Timestamp(u64),
    /// `A`.
    Array(Vec<FieldValue>),
    /// `F`, a nested table.
    Table(Table),
    /// `V`, no value.
    Void,
    /// Any other type, kept as its tag and encoded bytes.
    Other(u8, Vec<u8>),
}

/// A field table in wire order (duplicate keys are kept).
pub type Table = Vec<(Vec<u8>, FieldValue)>;

/// Appends big-endian fields to a frame payload.
#[derive(Default)]
pub(super) struct Writer(pub Vec<u8>);

impl Writer {
    pub(super) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    pub(super) fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(super) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(super) fn short_str(&mut self, s: &[u8]) -> Result<&mut Self, RawAmqpError> {
        let len = u8::try_from(s.len()).map_err(|_| RawAmqpError::TooLong(s.len()))?;
        self.0.push(len);
        self.0.extend_from_slice(s);
        Ok(self)
    }

    pub(super) fn long_str(&mut self, s: &[u8]) -> &mut Self {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s);
        self
    }

    pub(super) fn table(&mut self, table: &Table) -> Result<&mut Self, RawAmqpError> {
        let mut inner = Writer::default();
        for (key, value) in table {
            inner.short_str(key)?;
            inner.value(value)?;
        }
        self.long_str(&inner.0);
        Ok(self)
    }

    fn value(&mut self, value: &FieldValue) -> Result<(), RawAmqpError> {
        match value {
            FieldValue::LongStr(s) => self.u8(b'S').long_str(s),
            FieldValue::Int(i) => self.u8(b'I').u32(*i as u32),
            FieldValue::Long(l) => self.u8(b'l').u64(*l as u64),
            FieldValue::Bool(b) => self.u8(b't').u8(u8::from(*b)),
            FieldValue::Bytes(b) => self.u8(b'x').long_str(b),
            FieldValue::Timestamp(t) => self.u8(b'T').u64(*t),
            FieldValue::Void => self.u8(b'V'),
            FieldValue::Table(t) => self.u8(b'F').table(t)?,
            FieldValue::Array(items) => {
                let mut inner = Writer::default();
                for item in items {
                    inner.value(item)?;
                }
                self.u8(b'A').long_str(&inner.0)
            }
            FieldValue::Other(tag, raw) => {
                self.u8(*tag).0.extend_from_slice(raw);
                self
            }
        };
        Ok(())
    }
}

/// Reads big-endian fields from a frame payload.
pub(super) struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], RawAmqpError> {
        if self.0.len() < n {
            return Err(RawAmqpError::Protocol("a frame ended early".into()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub(super) fn u8(&mut self) -> Result<u8, RawAmqpError> {
        Ok(self.take(1)?[0])
    }

    pub(super) fn u16(&mut self) -> Result<u16, RawAmqpError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }

    pub(super) fn u32(&mut self) -> Result<u32, RawAmqpError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }

    pub(super) fn u64(&mut self) -> Result<u64, RawAmqpError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }

    pub(super) fn short_str(&mut self) -> Result<Vec<u8>, RawAmqpError> {
        let len = self.u8()? as usize;
        Ok(self.take(len)?.to_vec())
    }

    pub(super) fn long_str(&mut self) -> Result<Vec<u8>, RawAmqpError> {
        let len = self.u32()? as usize;
        Ok(self.take(len)?.to_vec())
    }

    pub(super) fn table(&mut self) -> Result<Table, RawAmqpError> {
        let raw = self.long_str()?;
        let mut inner = Reader(&raw);
        let mut out = Vec::new();
        while !inner.0.is_empty() {
            let key = inner.short_str()?;
            out.push((key, inner.value()?));
        }
        Ok(out)
    }

    fn value(&mut self) -> Result<FieldValue, RawAmqpError> {
        let tag = self.u8()?;
        // Fixed sizes of the scalar types RabbitMQ may send (its own
        // table, which differs from the 0-9-1 spec's on `s` and `l`).
        let fixed = match tag {
            b't' | b'b' | b'B' => 1,
            b's' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'D' => 5,
            b'l' | b'L' | b'd' | b'T' => 8,
            _ => 0,
        };
        Ok(match tag {
            b'S' => FieldValue::LongStr(self.long_str()?),
            b'x' => FieldValue::Bytes(self.long_str()?),
            b'I' => FieldValue::Int(self.u32()? as i32),
            b'l' => FieldValue::Long(self.u64()? as i64),
            b't' => FieldValue::Bool(self.u8()? != 0),
            b'T' => FieldValue::Timestamp(self.u64()?),
            b'V' => FieldValue::Void,
            b'F' => FieldValue::Table(self.table()?),
            b'A' => {
                let raw = self.long_str()?;
                let mut inner = Reader(&raw);
                let mut items = Vec::new();
                while !inner.0.is_empty() {
                    items.push(inner.value()?);
                }
                FieldValue::Array(items)
            }
            _ if fixed > 0 => FieldValue::Other(tag, self.take(fixed)?.to_vec()),
            _ => {
                return Err(RawAmqpError::Protocol(format!(
                    "unknown field type {:?}",
                    tag as char
                )))
            }
        })
    }
}

/// One frame: `type, channel, size, payload, 0xCE`.
pub(super) fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(kind).u16(channel).long_str(payload).u8(FRAME_END);
    w.0
}

/// A method frame's payload: class and method ids, then the arguments.
pub(super) fn method(class: u16, method: u16) -> Writer {
    let mut w = Writer::default();
    w.u16(class).u16(method);
    w
}

//! Kafka headers as bytes, names included, both ways. rdkafka's safe API
//! takes names as `&str` and unwraps a UTF-8 conversion of every name it
//! reads, so one record with a non-UTF-8 name would panic whoever reads it
//! (the consumer on every restart, the `dlq` command); a dead letter keeps
//! whatever its producer sent. This goes through librdkafka's C API (as
//! re-exported by rdkafka, so it is the librdkafka rdkafka links), and it is
//! the only code of dedupq that does.
//!
//! librdkafka hands names back NUL-terminated: a name with a NUL byte in it
//! reads back cut at the NUL.

use crate::message::Header;
use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedHeaders, BorrowedMessage, Message, OwnedHeaders};
use std::ffi::{c_char, c_void, CStr};

/// Every header of a consumed record, in order, duplicates kept.
pub fn of(message: &BorrowedMessage<'_>) -> Vec<Header> {
    // Only the list's pointer is taken here; nothing reads a name as text.
    message.headers().map(read).unwrap_or_default()
}

/// Every header of a list, in order, duplicates kept.
pub fn read(headers: &BorrowedHeaders) -> Vec<Header> {
    // rdkafka's `BorrowedHeaders` is the native list itself (that is how
    // rdkafka reads it back).
    let list = headers as *const BorrowedHeaders as *const rd::rd_kafka_headers_t;
    // SAFETY: `list` is alive for as long as `headers` is borrowed, which
    // outlasts this function.
    let count = unsafe { rd::rd_kafka_header_cnt(list) };
    let mut out = Vec::with_capacity(count);
    for idx in 0..count {
        let (mut name, mut value, mut size): (*const c_char, *const c_void, usize) =
            (std::ptr::null(), std::ptr::null(), 0);
        // SAFETY: idx < count; librdkafka writes the out-pointers, which
        // point into `list` (the name NUL-terminated, the value `size`
        // bytes or null).
        let err =
            unsafe { rd::rd_kafka_header_get_all(list, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: as above; both are copied before `headers` is released.
        let (name, value) = unsafe {
            (
                CStr::from_ptr(name).to_bytes().to_vec(),
                (!value.is_null())
                    .then(|| std::slice::from_raw_parts(value.cast::<u8>(), size).to_vec()),
            )
        };
        out.push(Header { name, value });
    }
    out
}

/// Headers to produce, names and values written byte for byte.
pub fn owned(headers: &[Header]) -> OwnedHeaders {
    let owned = OwnedHeaders::new_with_capacity(headers.len());
    // As in `read`: the borrowed view's address is the native list, which
    // `owned` owns and nothing else refers to yet.
    let list = owned.as_borrowed() as *const BorrowedHeaders as *mut rd::rd_kafka_headers_t;
    for h in headers {
        let (value, size) = match &h.value {
            Some(v) => (v.as_ptr().cast::<c_void>(), v.len() as isize),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: `list` is the writable list `owned` holds; librdkafka
        // copies name (of the given length) and value before returning.
        let err = unsafe {
            rd::rd_kafka_header_add(
                list,
                h.name.as_ptr().cast::<c_char>(),
                h.name.len() as isize,
                value,
                size,
            )
        };
        // Fails only on a read-only list, which a fresh one is not.
        debug_assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_utf8_names_null_values_and_duplicates_round_trip_in_order() {
        let headers = vec![
            Header::new(&b"\xff\xfeid"[..], &b"\x00\x01\xff"[..]),
            Header::new("client-id", "acme"),
            Header {
                name: b"\xff\xfeid".to_vec(),
                value: None,
            },
            Header::new("idempotency-key", ""),
            Header::new(&b"\xc3\x28"[..], &b"not utf-8 either: \xc3\x28"[..]),
        ];

        let list = owned(&headers);

        assert_eq!(read(list.as_borrowed()), headers);
        assert!(read(owned(&[]).as_borrowed()).is_empty());
    }
}

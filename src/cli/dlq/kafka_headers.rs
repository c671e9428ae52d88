//! Kafka headers as raw bytes, names included. rdkafka's safe API turns
//! names into `&str` and panics on one that is not UTF-8; a dead letter
//! keeps whatever a producer sent, so this goes through librdkafka's C API.

use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedMessage, OwnedHeaders};
use std::ffi::{c_void, CStr};

/// One header: name and value exactly as stored (a value may be null).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawHeader {
    pub name: Vec<u8>,
    pub value: Option<Vec<u8>>,
}

impl RawHeader {
    pub fn named(&self, name: &str) -> bool {
        self.name == name.as_bytes()
    }
}

/// Every header of a consumed record, in order.
pub fn read(message: &BorrowedMessage<'_>) -> Vec<RawHeader> {
    let mut out = Vec::new();
    // SAFETY: `message` keeps the native message (and so its headers) alive
    // for this call; librdkafka hands out pointers into it that we copy
    // before returning.
    unsafe {
        let mut headers: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
        if rd::rd_kafka_message_headers(message.ptr(), &mut headers)
            != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            return out;
        }
        for idx in 0.. {
            let mut name: *const std::os::raw::c_char = std::ptr::null();
            let mut value: *const c_void = std::ptr::null();
            let mut size: usize = 0;
            let err = rd::rd_kafka_header_get_all(headers, idx, &mut name, &mut value, &mut size);
            if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
                break;
            }
            let value = (!value.is_null())
                .then(|| std::slice::from_raw_parts(value as *const u8, size).to_vec());
            out.push(RawHeader {
                name: CStr::from_ptr(name).to_bytes().to_vec(),
                value,
            });
        }
    }
    out
}

/// Headers to produce, names written byte for byte.
pub fn owned(headers: &[RawHeader]) -> OwnedHeaders {
    let owned = OwnedHeaders::new_with_capacity(headers.len().max(1));
    // `as_borrowed` is a view whose address is the native headers object
    // (that is how rdkafka itself reads it back).
    let native = owned.as_borrowed() as *const _ as *mut rd::rd_kafka_headers_t;
    for h in headers {
        let (value, size) = match &h.value {
            Some(v) => (v.as_ptr() as *const c_void, v.len() as isize),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: `native` is the writable headers object `owned` owns;
        // librdkafka copies name and value.
        let err = unsafe {
            rd::rd_kafka_header_add(
                native,
                h.name.as_ptr() as *const std::os::raw::c_char,
                h.name.len() as isize,
                value,
                size,
            )
        };
        debug_assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    owned
}

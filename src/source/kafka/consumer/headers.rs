//! A consumed record's headers, read as bytes through librdkafka's C API.
//!
//! rdkafka's `Headers::get`/`iter` panic on a header name that is not UTF-8
//! (`CStr::to_str().unwrap()`), and Kafka does not require UTF-8 names: one such record would
//! stop every member that takes its partition. Here names and values are copied as bytes.
//!
//! What librdkafka (2.12, `rdkafka_msg.c`, `rdkafka_header.c`) hands out, exactly:
//! - the header block is parsed on first access; it is refused (`Local: Bad message format`) when
//!   it declares more than 100,000 headers or is malformed, and then no header can be read:
//!   [`read`] returns the error and the record is dead-lettered with it;
//! - a **name** is a NUL-terminated copy of the bytes on the wire, and `rd_kafka_header_get_all`
//!   returns only its pointer: a name containing a NUL byte reads as its bytes before the first
//!   NUL (the rest cannot be reached through the public API); every other byte, invalid UTF-8
//!   included, arrives as sent;
//! - a **value** is a pointer and a size: its exact bytes, NUL included; a null value (wire
//!   length -1) is a NULL pointer, an empty one a non-NULL pointer with size 0.
//!
//! Invariant: the unsafe code is here only, in [`read`] and [`copy_headers`]; both copy out of
//! memory owned by the message, which outlives the call.

use std::ffi::{c_char, c_void, CStr};

use bytes::Bytes;
use rdkafka::message::BorrowedMessage;
use rdkafka_sys::bindings::{
    rd_kafka_header_get_all, rd_kafka_headers_t, rd_kafka_message_headers,
};
use rdkafka_sys::types::RDKafkaRespErr;

use crate::source::Header;

/// The headers of `m`, in order, or why librdkafka could not parse them.
pub(crate) fn read(m: &BorrowedMessage<'_>) -> Result<Vec<Header>, String> {
    let mut list: *mut rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `m.ptr()` is a valid consumed message for the lifetime of `m`, and `list` a valid
    // out-pointer. librdkafka parses the header block into a list owned by the message (rdkafka's
    // own `headers()` makes the same call on a shared message).
    let err = unsafe { rd_kafka_message_headers(m.ptr(), &mut list) };
    match err {
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR if !list.is_null() => {
            // SAFETY: `list` was just returned for `m` and lives as long as `m`.
            Ok(unsafe { copy_headers(list) })
        }
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR | RDKafkaRespErr::RD_KAFKA_RESP_ERR__NOENT => {
            Ok(Vec::new())
        }
        e => Err(format!(
            "librdkafka cannot parse the header block: {}",
            rdkafka::error::RDKafkaErrorCode::from(e)
        )),
    }
}

/// Copies every header of `list` (see the module's notes for what names and values hold).
///
/// # Safety
/// `list` must point to a valid librdkafka header list that is not modified or freed during the
/// call.
pub(crate) unsafe fn copy_headers(list: *const rd_kafka_headers_t) -> Vec<Header> {
    let mut headers = Vec::new();
    for index in 0.. {
        let mut name: *const c_char = std::ptr::null();
        let mut value: *const c_void = std::ptr::null();
        let mut size: usize = 0;
        // SAFETY: `list` is valid (the caller's contract); the out-pointers are valid locals.
        // librdkafka returns NOENT past the last header and then writes nothing.
        let err = unsafe { rd_kafka_header_get_all(list, index, &mut name, &mut value, &mut size) };
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            break;
        }
        // SAFETY: on success `name` points to the header's NUL-terminated name and `value` to
        // `size` bytes (or is NULL for a null value), both owned by `list` and unchanged while it
        // lives; they are copied before the next call.
        let (key, value) = unsafe {
            let key = Bytes::copy_from_slice(CStr::from_ptr(name).to_bytes());
            let value = (!value.is_null())
                .then(|| Bytes::copy_from_slice(std::slice::from_raw_parts(value.cast(), size)));
            (key, value)
        };
        headers.push(Header { key, value });
    }
    headers
}

#[cfg(test)]
mod tests {
    use rdkafka_sys::bindings::{
        rd_kafka_header_add, rd_kafka_headers_destroy, rd_kafka_headers_new,
    };

    use super::*;

    /// A librdkafka header list built with explicit sizes, as the parser of a consumed record
    /// builds it; destroyed on drop.
    struct List(*mut rd_kafka_headers_t);

    impl List {
        fn new(headers: &[(&[u8], Option<&[u8]>)]) -> Self {
            // SAFETY: a fresh list; every pointer is passed with its exact size and copied by
            // librdkafka.
            unsafe {
                let list = rd_kafka_headers_new(headers.len());
                for (name, value) in headers {
                    let (ptr, len) = match value {
                        Some(v) => (v.as_ptr().cast(), v.len() as isize),
                        None => (std::ptr::null(), 0),
                    };
                    let name_len = name.len() as isize;
                    let err = rd_kafka_header_add(list, name.as_ptr().cast(), name_len, ptr, len);
                    assert_eq!(err, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
                }
                List(list)
            }
        }
    }

    impl Drop for List {
        fn drop(&mut self) {
            // SAFETY: created by `rd_kafka_headers_new`, destroyed once.
            unsafe { rd_kafka_headers_destroy(self.0) }
        }
    }

    type Pair<'a> = (&'a [u8], Option<&'a [u8]>);

    #[test]
    fn names_and_values_are_copied_as_bytes() {
        let list = List::new(&[
            (b"id", Some(b"abc\0def")),
            (&[0xff, 0xfe, b'x'], Some(&[0x00])),
            (b"cut\0after", Some(b"v")),
            (b"null", None),
            (b"", Some(b"")),
        ]);
        // SAFETY: `list` is valid until dropped at the end of the test.
        let headers = unsafe { copy_headers(list.0) };
        let got: Vec<Pair<'_>> = headers
            .iter()
            .map(|h| (&h.key[..], h.value.as_deref()))
            .collect();
        let expected: Vec<Pair<'_>> = vec![
            (b"id", Some(b"abc\0def")),
            (&[0xff, 0xfe, b'x'], Some(&[0x00])),
            (b"cut", Some(b"v")), // a name is seen up to its first NUL byte
            (b"null", None),
            (b"", Some(b"")),
        ];
        assert_eq!(got, expected);
    }

    #[test]
    fn an_empty_list_has_no_headers() {
        let list = List::new(&[]);
        // SAFETY: `list` is valid until dropped at the end of the test.
        assert!(unsafe { copy_headers(list.0) }.is_empty());
    }
}

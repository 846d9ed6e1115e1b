//! A RabbitMQ delivery as the pipeline's record: its body the value, its `message_id` property
//! the key (the id MassTransit and NServiceBus set, read by `--id-from key`, the queue source's
//! default), its `timestamp_in_ms` header (set by RabbitMQ's message timestamp interceptor) or
//! else its `timestamp` property (whole seconds) the timestamp, its headers table the headers, and
//! its position the channel's base plus its delivery tag less one (module `source`).
//!
//! AMQP header values are typed. A header becomes bytes as follows: a string or a byte array as
//! its bytes; a number, a boolean, a decimal or a timestamp as its decimal text; `void` as a null
//! header; a nested table or array as its JSON-like text (a header's value is never dropped). The
//! table holds each name once, in name order (the client reads it into a sorted map).

use std::sync::Arc;

use bytes::Bytes;
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

use super::wire::{self, RAW_PROPERTIES};
use crate::source::{Header, RawMessage};

/// The record of a delivery of `queue` at `position`.
pub(crate) fn to_raw(
    queue: &Arc<str>,
    position: i64,
    properties: &BasicProperties,
    body: Vec<u8>,
) -> RawMessage {
    if let Some(carried) = carried_properties(properties) {
        return from_carried(queue, position, carried, body);
    }
    let key = properties
        .message_id()
        .as_ref()
        .map(|id| Bytes::copy_from_slice(id.as_str().as_bytes()));
    let timestamp_ms = properties
        .headers()
        .as_ref()
        .and_then(|t| t.inner().get(TIMESTAMP_IN_MS))
        .and_then(milliseconds)
        .or_else(|| {
            properties
                .timestamp()
                .and_then(|s| i64::try_from(s).ok())
                .and_then(|s| s.checked_mul(1000))
        });
    let headers = properties
        .headers()
        .as_ref()
        .map(headers_of)
        .unwrap_or_default();
    RawMessage {
        topic: queue.clone(),
        partition: 0,
        offset: position,
        timestamp_ms,
        key,
        payload: Some(Bytes::from(body)),
        headers,
        header_error: None,
    }
}

/// The header RabbitMQ's message timestamp interceptor sets (`timestamp_in_ms`, milliseconds
/// since the epoch); preferred to the `timestamp` property, which has whole seconds.
const TIMESTAMP_IN_MS: &str = "timestamp_in_ms";

/// A header's integer value as milliseconds, if it is one (and not negative).
fn milliseconds(value: &AMQPValue) -> Option<i64> {
    let ms = match value {
        AMQPValue::LongLongInt(n) => *n,
        AMQPValue::LongInt(n) => i64::from(*n),
        AMQPValue::LongUInt(n) => i64::from(*n),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok()?,
        _ => return None,
    };
    (ms >= 0).then_some(ms)
}

/// The original property list the frame guard carried in [`RAW_PROPERTIES`], if it did.
fn carried_properties(properties: &BasicProperties) -> Option<&[u8]> {
    match properties.headers().as_ref()?.inner().get(RAW_PROPERTIES)? {
        AMQPValue::ByteArray(b) => Some(b.as_slice()),
        _ => None,
    }
}

/// The record of a delivery whose properties the client could not read (module `wire`): its
/// key, timestamp and headers read from the original bytes, exactly; a header table that cannot
/// be read is the record's `header_error`, and so is a property list that cannot be.
fn from_carried(queue: &Arc<str>, position: i64, carried: &[u8], body: Vec<u8>) -> RawMessage {
    let mut raw = RawMessage {
        topic: queue.clone(),
        partition: 0,
        offset: position,
        timestamp_ms: None,
        key: None,
        payload: Some(Bytes::from(body)),
        headers: Vec::new(),
        header_error: None,
    };
    if carried.is_empty() {
        raw.header_error = Some(
            "the delivery's properties could not be read and were too large to carry in a frame"
                .to_owned(),
        );
        return raw;
    }
    match wire::read(carried, true) {
        Ok(p) => {
            raw.key = p.message_id.map(Bytes::from);
            let in_ms = p
                .headers
                .iter()
                .find(|(name, _)| name.as_slice() == TIMESTAMP_IN_MS.as_bytes())
                .and_then(|(_, v)| milliseconds(v));
            raw.timestamp_ms = in_ms.or_else(|| {
                p.timestamp
                    .and_then(|s| i64::try_from(s).ok())
                    .and_then(|s| s.checked_mul(1000))
            });
            let mut headers: Vec<Header> = p
                .headers
                .iter()
                .map(|(name, value)| Header {
                    key: Bytes::copy_from_slice(name),
                    value: header_value(value),
                })
                .collect();
            // As the client's table does: in name order.
            headers.sort_by(|a, b| a.key.cmp(&b.key));
            raw.headers = headers;
            raw.header_error = p.header_error;
        }
        Err(e) => raw.header_error = Some(format!("the delivery's properties cannot be read: {e}")),
    }
    raw
}

/// The headers of a table, in name order.
fn headers_of(table: &FieldTable) -> Vec<Header> {
    table
        .into_iter()
        .map(|(name, value)| Header {
            key: Bytes::copy_from_slice(name.as_str().as_bytes()),
            value: header_value(value),
        })
        .collect()
}

/// A header's value as bytes (`None`: void).
fn header_value(value: &AMQPValue) -> Option<Bytes> {
    match value {
        AMQPValue::Void => None,
        AMQPValue::LongString(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        AMQPValue::ShortString(s) => Some(Bytes::copy_from_slice(s.as_str().as_bytes())),
        AMQPValue::ByteArray(b) => Some(Bytes::copy_from_slice(b.as_slice())),
        other => Some(Bytes::from(text_of(other))),
    }
}

/// A value's text: numbers in decimal, nested values as JSON-like text.
fn text_of(value: &AMQPValue) -> String {
    match value {
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        AMQPValue::DecimalValue(d) => {
            // value × 10^-scale, exactly.
            let digits = d.value.to_string();
            let scale = usize::from(d.scale);
            if scale == 0 {
                digits
            } else {
                let padded = format!("{digits:0>width$}", width = scale + 1);
                let (int, frac) = padded.split_at(padded.len() - scale);
                format!("{int}.{frac}")
            }
        }
        AMQPValue::Timestamp(t) => t.to_string(),
        AMQPValue::Void => "null".to_owned(),
        AMQPValue::ShortString(s) => json_string(s.as_str().as_bytes()),
        AMQPValue::LongString(s) => json_string(s.as_bytes()),
        AMQPValue::ByteArray(b) => json_string(b.as_slice()),
        AMQPValue::FieldArray(a) => {
            let items: Vec<String> = a.as_slice().iter().map(text_of).collect();
            format!("[{}]", items.join(","))
        }
        AMQPValue::FieldTable(t) => {
            let items: Vec<String> = t
                .into_iter()
                .map(|(k, v)| format!("{}:{}", json_string(k.as_str().as_bytes()), text_of(v)))
                .collect();
            format!("{{{}}}", items.join(","))
        }
    }
}

/// Bytes as a JSON string (lossy for bytes that are not UTF-8).
fn json_string(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    serde_json::to_string(&text).unwrap_or_else(|_| "\"\"".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{DecimalValue, FieldArray, LongString, ShortString};

    #[test]
    fn properties_become_the_record_s_key_timestamp_and_headers() {
        let mut table = FieldTable::default();
        table.insert(
            ShortString::from("id"),
            AMQPValue::LongString(LongString::from(b"\xff\x00raw".to_vec())),
        );
        table.insert(ShortString::from("n"), AMQPValue::LongLongInt(-42));
        table.insert(ShortString::from("gone"), AMQPValue::Void);
        table.insert(
            ShortString::from("price"),
            AMQPValue::DecimalValue(DecimalValue { scale: 3, value: 5 }),
        );
        let mut nested = FieldTable::default();
        nested.insert(ShortString::from("a"), AMQPValue::Boolean(true));
        let mut array = FieldArray::default();
        array.push(AMQPValue::FieldTable(nested));
        array.push(AMQPValue::LongInt(7));
        table.insert(ShortString::from("list"), AMQPValue::FieldArray(array));
        let properties = BasicProperties::default()
            .with_message_id(ShortString::from("m-1"))
            .with_timestamp(1_700_000_000)
            .with_headers(table);
        let queue: Arc<str> = Arc::from("q");
        let raw = to_raw(&queue, 41, &properties, b"{}".to_vec());
        assert_eq!(raw.offset, 41);
        assert_eq!(raw.partition, 0);
        assert_eq!(raw.key.as_deref(), Some(&b"m-1"[..]));
        assert_eq!(raw.timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(raw.payload.as_deref(), Some(&b"{}"[..]));
        let shown: Vec<(&[u8], Option<&[u8]>)> = raw
            .headers
            .iter()
            .map(|h| (&h.key[..], h.value.as_deref()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (&b"gone"[..], None),
                (&b"id"[..], Some(&b"\xff\x00raw"[..])),
                (&b"list"[..], Some(&b"[{\"a\":true},7]"[..])),
                (&b"n"[..], Some(&b"-42"[..])),
                (&b"price"[..], Some(&b"0.005"[..])),
            ]
        );
    }

    #[test]
    fn a_delivery_without_properties_has_no_key_timestamp_or_headers() {
        let queue: Arc<str> = Arc::from("q");
        let raw = to_raw(&queue, 0, &BasicProperties::default(), Vec::new());
        assert_eq!(raw.key, None);
        assert_eq!(raw.timestamp_ms, None);
        assert!(raw.headers.is_empty());
        assert_eq!(raw.payload.as_deref(), Some(&b""[..]));
        // A timestamp past i64 milliseconds is none, not a wrapped one.
        let far = BasicProperties::default().with_timestamp(u64::MAX);
        assert_eq!(to_raw(&queue, 0, &far, Vec::new()).timestamp_ms, None);
    }

    /// Properties carried by the frame guard (module `wire`) as the client gets them.
    fn carried(original: &[u8]) -> BasicProperties {
        let mut table = FieldTable::default();
        table.insert(
            ShortString::from(RAW_PROPERTIES),
            AMQPValue::ByteArray(original.to_vec().into()),
        );
        BasicProperties::default().with_headers(table)
    }

    #[test]
    fn carried_properties_give_the_exact_id_timestamp_and_header_names() {
        // flags: headers, message_id, timestamp
        let mut p = ((1u16 << 13) | (1 << 7) | (1 << 6)).to_be_bytes().to_vec();
        let mut table = vec![2, b'z', 0xff, b'I', 0, 0, 0, 9];
        table.extend_from_slice(&[1, b'a', b'S', 0, 0, 0, 1, b'x']);
        p.extend_from_slice(&(table.len() as u32).to_be_bytes());
        p.extend_from_slice(&table);
        p.extend_from_slice(&[3, 0xc3, 0x28, b'!']);
        p.extend_from_slice(&1_700_000_000u64.to_be_bytes());
        let queue: Arc<str> = Arc::from("q");
        let raw = to_raw(&queue, 3, &carried(&p), b"body".to_vec());
        assert_eq!(raw.offset, 3);
        assert_eq!(raw.key.as_deref(), Some(&b"\xc3\x28!"[..]));
        assert_eq!(raw.timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(raw.payload.as_deref(), Some(&b"body"[..]));
        assert_eq!(raw.header_error, None);
        let shown: Vec<(&[u8], Option<&[u8]>)> = raw
            .headers
            .iter()
            .map(|h| (&h.key[..], h.value.as_deref()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (&b"a"[..], Some(&b"x"[..])),
                (&b"z\xff"[..], Some(&b"9"[..]))
            ]
        );
    }

    #[test]
    fn carried_properties_that_cannot_be_read_are_a_header_error() {
        let queue: Arc<str> = Arc::from("q");
        let raw = to_raw(&queue, 0, &carried(&[]), Vec::new());
        assert_eq!(raw.key, None);
        assert!(raw.header_error.unwrap().contains("too large"));
        // message_id announced, cut short
        let raw = to_raw(&queue, 0, &carried(&[0, 0x80, 9, b'a']), Vec::new());
        assert_eq!(raw.key, None);
        assert!(raw.header_error.unwrap().contains("cannot be read"));
    }

    #[test]
    fn timestamp_in_ms_is_preferred_to_the_seconds_of_the_property() {
        let mut table = FieldTable::default();
        table.insert(
            ShortString::from(TIMESTAMP_IN_MS),
            AMQPValue::LongLongInt(1_700_000_000_123),
        );
        let properties = BasicProperties::default()
            .with_timestamp(1_600_000_000)
            .with_headers(table);
        let queue: Arc<str> = Arc::from("q");
        let raw = to_raw(&queue, 0, &properties, Vec::new());
        assert_eq!(raw.timestamp_ms, Some(1_700_000_000_123));
        // Not a number, or negative: the property's seconds.
        for bad in [
            AMQPValue::LongString(b"soon".to_vec().into()),
            AMQPValue::LongLongInt(-5),
        ] {
            let mut table = FieldTable::default();
            table.insert(ShortString::from(TIMESTAMP_IN_MS), bad);
            let properties = BasicProperties::default()
                .with_timestamp(1_600_000_000)
                .with_headers(table);
            let raw = to_raw(&queue, 0, &properties, Vec::new());
            assert_eq!(raw.timestamp_ms, Some(1_600_000_000_000));
        }
    }
}

//! The SQL handler's input: record values checked to be JSON that `jsonb` stores, and the batch's
//! new messages as one `jsonb` array, the statement's `$1`.
//!
//! Invariant: every value that reaches the array is a JSON document PostgreSQL accepts as
//! `jsonb`, so building `$1` never fails on content: a value that is not one is dead-lettered at
//! decoding (`invalid_payload`), and a key that `jsonb` text cannot hold becomes `null`.

use std::fmt::Write as _;

use bytes::{BufMut, Bytes, BytesMut};
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

use crate::message::{Decode, Message, RawMessage};
use crate::reason::Reason;

/// A record value that is a JSON document `jsonb` accepts: the SQL handler's payload type. It
/// holds the value's bytes as received (shared with the record, not copied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPayload(Bytes);

impl JsonPayload {
    /// The JSON text, exactly as received.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl Decode for JsonPayload {
    fn decode(raw: &RawMessage) -> Result<Self, (Reason, String)> {
        match &raw.payload {
            None => Err((Reason::EmptyPayload, "the record has no value".to_owned())),
            Some(bytes) if bytes.is_empty() => {
                Err((Reason::EmptyPayload, "the record has no value".to_owned()))
            }
            Some(bytes) => match check_json(bytes) {
                Ok(()) => Ok(JsonPayload(bytes.clone())),
                Err(detail) => Err((Reason::InvalidPayload, detail)),
            },
        }
    }
}

/// Whether `bytes` is one JSON document that `jsonb` stores: well-formed (serde_json also refuses
/// invalid UTF-8, lone surrogates and nesting deeper than 128), and without the NUL character,
/// which PostgreSQL text cannot hold.
fn check_json(bytes: &[u8]) -> Result<(), String> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the value is not JSON: {e}"))?;
    if holds_nul(&value) {
        return Err("the value holds \\u0000, which PostgreSQL's jsonb cannot store".to_owned());
    }
    Ok(())
}

fn holds_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// The statement's `$1`: one object per message, in the slice's (partition) order.
pub(super) fn input_array(messages: &[Message<JsonPayload>]) -> String {
    let values: usize = messages.iter().map(|m| m.payload.0.len()).sum();
    let mut out = String::with_capacity(values + 160 * messages.len() + 2);
    out.push('[');
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let raw = &m.raw;
        // Writing to a String cannot fail.
        let _ = write!(out, "{{\"id\":\"{}\",\"key\":", m.id);
        push_key(&mut out, raw.key.as_deref());
        let _ = write!(
            out,
            ",\"partition\":{},\"offset\":{},\"timestamp_ms\":",
            raw.partition, raw.offset
        );
        match raw.timestamp_ms {
            Some(ts) => {
                let _ = write!(out, "{ts}");
            }
            None => out.push_str("null"),
        }
        out.push_str(",\"value\":");
        // Checked at decoding: JSON, hence UTF-8.
        out.push_str(std::str::from_utf8(m.payload.as_bytes()).unwrap_or("null"));
        out.push('}');
    }
    out.push(']');
    out
}

/// The key as a JSON string, or `null` when there is none, it is not UTF-8, or it holds a NUL.
fn push_key(out: &mut String, key: Option<&[u8]>) {
    let text = key
        .and_then(|k| std::str::from_utf8(k).ok())
        .filter(|k| !k.contains('\0'));
    match text.and_then(|k| serde_json::to_string(k).ok()) {
        Some(quoted) => out.push_str(&quoted),
        None => out.push_str("null"),
    }
}

/// JSON text sent as a `jsonb` parameter (binary format: version 1, then the text).
#[derive(Debug)]
pub(super) struct Jsonb<'a>(pub(super) &'a str);

impl ToSql for Jsonb<'_> {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.put_u8(1);
        out.put_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::tests::raw;
    use std::sync::Arc;

    fn decode(value: &[u8]) -> Result<JsonPayload, Reason> {
        let mut r = raw(0, None, "");
        r.payload = Some(Bytes::copy_from_slice(value));
        JsonPayload::decode(&r).map_err(|(reason, _)| reason)
    }

    #[test]
    fn values_are_json_that_jsonb_stores() {
        for ok in [
            &b"{}"[..],
            b" [1, 2.5, null] ",
            b"\"x\"",
            b"42",
            b"{\"a\":\"\\u00e9\"}",
        ] {
            assert!(decode(ok).is_ok(), "{:?}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b"{"[..],
            b"{} {}",
            b"\xff",
            b"\"\xc3\"",
            b"{\"a\":\"\\u0000\"}",
            b"{\"\\u0000\":1}",
            b"\"\\ud800\"",
            b"nul",
        ] {
            assert_eq!(
                decode(bad),
                Err(Reason::InvalidPayload),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(decode(deep.as_bytes()), Err(Reason::InvalidPayload));
        assert_eq!(decode(b""), Err(Reason::EmptyPayload));
    }

    #[test]
    fn the_array_holds_every_field_in_order() {
        let message = |offset: i64, key: Option<&[u8]>, ts: Option<i64>, value: &str| {
            let mut r = raw(offset, None, value);
            r.key = key.map(Bytes::copy_from_slice);
            r.timestamp_ms = ts;
            Message {
                id: uuid::Uuid::from_u128(offset as u128 + 1),
                payload: JsonPayload(Bytes::copy_from_slice(value.as_bytes())),
                raw: Arc::new(r),
            }
        };
        let messages = [
            message(3, Some(b"k\"1"), Some(17), "{\"a\": 1}"),
            message(4, Some(b"\xff"), None, "[true]"),
            message(5, Some(b"a\0b"), Some(-1), "\"s\""),
            message(6, None, None, "null"),
        ];
        let text = input_array(&messages);
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        let expected = serde_json::json!([
            {"id": "00000000-0000-0000-0000-000000000004", "key": "k\"1", "partition": 0,
             "offset": 3, "timestamp_ms": 17, "value": {"a": 1}},
            {"id": "00000000-0000-0000-0000-000000000005", "key": null, "partition": 0,
             "offset": 4, "timestamp_ms": null, "value": [true]},
            {"id": "00000000-0000-0000-0000-000000000006", "key": null, "partition": 0,
             "offset": 5, "timestamp_ms": -1, "value": "s"},
            {"id": "00000000-0000-0000-0000-000000000007", "key": null, "partition": 0,
             "offset": 6, "timestamp_ms": null, "value": null},
        ]);
        assert_eq!(parsed, expected);
        assert_eq!(input_array(&[]), "[]");
    }
}

//! The SQL handler's input: record values checked to be JSON that `jsonb` stores, and the batch's
//! new messages as one `jsonb` array, the statement's `$1`.
//!
//! Invariant: every value that reaches the array is a JSON document PostgreSQL accepts as
//! `jsonb`, so building `$1` never fails on content: a value that is not one is dead-lettered at
//! decoding (`invalid_payload`), and a key that `jsonb` text cannot hold becomes `null`.

use std::fmt::Write as _;

use bytes::{BufMut, Bytes, BytesMut};
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

use crate::pipeline::message::{
    clean_text, parse_id, Decode, Decoding, Message, RawMessage, Tombstones, ValueFormat,
};
use crate::reason::Reason;

/// A record as the SQL handler passes it on: its value as JSON text that `jsonb` accepts (the
/// value as received for `json`, a JSON string for `text`, `{"hex": …}` for `bytes`, `null` for a
/// tombstone) and its id as received: the SQL handler's payload type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPayload {
    value: Bytes,
    id: String,
    tombstone: bool,
    /// Whether `value` is the record's own JSON (`--value-format json`), not one built for it.
    json: bool,
}

impl JsonPayload {
    /// The value's JSON text: for `--value-format json`, exactly as received.
    pub fn as_bytes(&self) -> &[u8] {
        &self.value
    }

    /// Whether the record was a tombstone (no value).
    pub fn is_tombstone(&self) -> bool {
        self.tombstone
    }

    /// The record's own JSON value: `None` for a tombstone and for `--value-format text` and
    /// `bytes`.
    pub(super) fn json(&self) -> Option<&[u8]> {
        self.json.then_some(&self.value[..])
    }
}

impl Decode for JsonPayload {
    fn decode(raw: &RawMessage) -> Result<Self, (Reason, String)> {
        Self::decode_with(raw, &Decoding::default())
    }

    fn decode_with(raw: &RawMessage, decoding: &Decoding) -> Result<Self, (Reason, String)> {
        let id = original_id(raw, decoding);
        let Some(bytes) = &raw.payload else {
            return match decoding.tombstones {
                Tombstones::Pass => Ok(JsonPayload {
                    value: Bytes::from_static(b"null"),
                    id,
                    tombstone: true,
                    json: false,
                }),
                Tombstones::DeadLetter => Err((
                    Reason::EmptyPayload,
                    "the record has no value (a tombstone)".to_owned(),
                )),
            };
        };
        let json = decoding.values == ValueFormat::Json;
        let value =
            match decoding.values {
                ValueFormat::Json if bytes.is_empty() => {
                    return Err((
                        Reason::EmptyPayload,
                        "the record's value is empty".to_owned(),
                    ))
                }
                ValueFormat::Json => match check_json(bytes) {
                    Ok(()) => bytes.clone(),
                    Err(detail) => return Err((Reason::InvalidPayload, detail)),
                },
                ValueFormat::Text => match std::str::from_utf8(bytes) {
                    Err(e) => {
                        return Err((
                            Reason::InvalidPayload,
                            format!("the value is not UTF-8 text: {e}"),
                        ))
                    }
                    Ok(text) if text.contains('\0') => return Err((
                        Reason::InvalidPayload,
                        "the value holds a NUL character, which PostgreSQL's jsonb cannot store \
                         (use --value-format bytes)"
                            .to_owned(),
                    )),
                    Ok(text) => Bytes::from(json_string(text)),
                },
                ValueFormat::Bytes => Bytes::from(format!("{{\"hex\":\"{}\"}}", hex(bytes))),
            };
        Ok(JsonPayload {
            value,
            id,
            tombstone: false,
            json,
        })
    }
}

/// The element's `"id"` as JSON: a UUID id as its canonical text (what it always was), any other
/// id as text when it is UTF-8 without NUL, else `{"hex": …}`; `null` without one (ids from
/// positions, a tombstone without its id header).
fn original_id(raw: &RawMessage, decoding: &Decoding) -> String {
    match decoding.ids.original(raw) {
        None => "null".to_owned(),
        Some(bytes) => match parse_id(bytes) {
            Ok(uuid) => format!("\"{uuid}\""),
            Err(_) => text_or_hex(bytes),
        },
    }
}

/// `bytes` as a JSON string when they are text `jsonb` stores, else as `{"hex": …}`.
fn text_or_hex(bytes: &[u8]) -> String {
    match clean_text(bytes) {
        Some(text) => json_string(text),
        None => format!("{{\"hex\":\"{}\"}}", hex(bytes)),
    }
}

fn json_string(text: &str) -> String {
    // Serializing a &str cannot fail.
    serde_json::to_string(text).unwrap_or_else(|_| "null".to_owned())
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Whether `bytes` is one JSON document that `jsonb` stores: well-formed (serde_json also refuses
/// invalid UTF-8, lone surrogates and nesting deeper than 128), and without the NUL character,
/// which PostgreSQL text cannot hold. Read through once, building nothing.
fn check_json(bytes: &[u8]) -> Result<(), String> {
    match serde_json::from_slice::<JsonbText>(bytes) {
        Ok(JsonbText) => Ok(()),
        Err(e) if e.to_string().starts_with(HOLDS_NUL) => {
            Err("the value holds \\u0000, which PostgreSQL's jsonb cannot store".to_owned())
        }
        Err(e) => Err(format!("the value is not JSON: {e}")),
    }
}

const HOLDS_NUL: &str = "a string holds NUL";

/// A JSON document read for [`check_json`]: every string and member name is checked for NUL, the
/// rest skipped.
struct JsonbText;

impl<'de> serde::Deserialize<'de> for JsonbText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonbText)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonbText {
    type Value = JsonbText;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self, E> {
        match s.contains('\0') {
            true => Err(E::custom(HOLDS_NUL)),
            false => Ok(self),
        }
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<JsonbText>()?.is_some() {}
        Ok(self)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        while map.next_key::<JsonbText>()?.is_some() {
            map.next_value::<JsonbText>()?;
        }
        Ok(self)
    }
}

/// The statement's `$1`: one object per message, in the slice's (partition) order, with the
/// fields docs/SQL-HANDLER.md lists; `given`, when there, holds each message's `value` as JSON
/// text in its place (an envelope's payload).
pub(super) fn input_array(messages: &[&Message<JsonPayload>], given: Option<&[String]>) -> String {
    let values: usize = messages.iter().map(|m| m.payload.value.len()).sum();
    let mut out = String::with_capacity(values + 256 * messages.len() + 2);
    out.push('[');
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let raw = &m.raw;
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "{{\"message_id\":\"{}\",\"id\":{},\"topic\":{},\"key\":",
            m.id,
            m.payload.id,
            json_string(&raw.topic)
        );
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
        out.push_str(",\"headers\":");
        push_headers(&mut out, raw);
        let _ = write!(out, ",\"tombstone\":{}", m.payload.tombstone);
        out.push_str(",\"value\":");
        match given {
            Some(given) => out.push_str(&given[i]),
            // Checked or built at decoding: JSON, hence UTF-8.
            None => out.push_str(std::str::from_utf8(&m.payload.value).unwrap_or("null")),
        }
        out.push('}');
    }
    out.push(']');
    out
}

/// The headers as one object: name to value (text, `{"hex": …}`, or `null` for a null value),
/// an array of them when a name repeats, in the record's order. A name that is not text `jsonb`
/// stores is written `hex:` and its bytes in hex.
fn push_headers(out: &mut String, raw: &RawMessage) {
    // In first-appearance order; a map keeps a record of many headers linear.
    let mut slot: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
    let mut groups: Vec<(&[u8], Vec<String>)> = Vec::new();
    for h in &raw.headers {
        let value = h
            .value
            .as_deref()
            .map_or_else(|| "null".to_owned(), text_or_hex);
        let i = *slot.entry(&h.key[..]).or_insert_with(|| {
            groups.push((&h.key[..], Vec::new()));
            groups.len() - 1
        });
        groups[i].1.push(value);
    }
    out.push('{');
    for (i, (name, values)) in groups.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match clean_text(name) {
            Some(text) => out.push_str(&json_string(text)),
            None => out.push_str(&json_string(&format!("hex:{}", hex(name)))),
        }
        out.push(':');
        match values.as_slice() {
            [one] => out.push_str(one),
            many => {
                out.push('[');
                out.push_str(&many.join(","));
                out.push(']');
            }
        }
    }
    out.push('}');
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

/// JSON text sent as a `jsonb` parameter or array element, as it is (binary format: version 1,
/// then the text): borrowed (`$1`) or owned (a typed `jsonb[]`'s elements).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Jsonb<T>(pub(super) T);

impl<T: AsRef<str> + std::fmt::Debug + Sync> ToSql for Jsonb<T> {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.put_u8(1);
        out.put_slice(self.0.as_ref().as_bytes());
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
    use crate::pipeline::message::tests::raw;
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

    fn message(
        offset: i64,
        key: Option<&[u8]>,
        ts: Option<i64>,
        value: &str,
    ) -> Message<JsonPayload> {
        let mut r = raw(offset, None, value);
        r.key = key.map(Bytes::copy_from_slice);
        r.timestamp_ms = ts;
        Message {
            id: uuid::Uuid::from_u128(offset as u128 + 1),
            payload: JsonPayload::decode_with(&r, &Decoding::default()).unwrap(),
            raw: Arc::new(r),
        }
    }

    fn parsed(messages: &[Message<JsonPayload>]) -> serde_json::Value {
        let refs: Vec<&Message<JsonPayload>> = messages.iter().collect();
        serde_json::from_str(&input_array(&refs, None)).unwrap()
    }

    #[test]
    fn the_array_holds_every_field_in_order() {
        let messages = [
            message(3, Some(b"k\"1"), Some(17), "{\"a\": 1}"),
            message(4, Some(b"\xff"), None, "[true]"),
            message(5, Some(b"a\0b"), Some(-1), "\"s\""),
            message(6, None, None, "null"),
        ];
        let element =
            |n: u128, key: serde_json::Value, offset: i64, ts: serde_json::Value, value| {
                serde_json::json!({"message_id": uuid::Uuid::from_u128(n).to_string(), "id": null,
                "topic": "t", "key": key, "partition": 0, "offset": offset, "timestamp_ms": ts,
                "headers": {}, "tombstone": false, "value": value})
            };
        let expected = serde_json::json!([
            element(4, "k\"1".into(), 3, 17.into(), serde_json::json!({"a": 1})),
            element(
                5,
                serde_json::Value::Null,
                4,
                serde_json::Value::Null,
                serde_json::json!([true])
            ),
            element(6, serde_json::Value::Null, 5, (-1).into(), "s".into()),
            element(
                7,
                serde_json::Value::Null,
                6,
                serde_json::Value::Null,
                serde_json::Value::Null
            ),
        ]);
        assert_eq!(parsed(&messages), expected);
        assert_eq!(input_array(&[], None), "[]");
    }

    #[test]
    fn ids_and_headers_are_text_or_hex_and_repeated_names_are_arrays() {
        use crate::pipeline::message::{Header, IdFormat, IdRules};
        let mut r = raw(0, Some(" 0191E5A0-0000-7000-8000-000000000001 "), "{}");
        let h = |k: &'static [u8], v: Option<&'static [u8]>| Header {
            key: Bytes::from_static(k),
            value: v.map(Bytes::from_static),
        };
        r.headers.extend([
            h(b"ce_type", Some(b"order.created")),
            h(b"seen", Some(b"a")),
            h(b"\xff\x00", Some(b"\x01\x00")),
            h(b"seen", None),
            h(b"seen", Some(b"nul\0")),
        ]);
        let d = Decoding::default();
        let m = Message {
            id: uuid::Uuid::from_u128(1),
            payload: JsonPayload::decode_with(&r, &d).unwrap(),
            raw: Arc::new(r.clone()),
        };
        let e = &parsed(&[m])[0];
        assert_eq!(
            e["id"], "0191e5a0-0000-7000-8000-000000000001",
            "a UUID id as before"
        );
        assert_eq!(
            e["headers"],
            serde_json::json!({
                "id": " 0191E5A0-0000-7000-8000-000000000001 ",
                "ce_type": "order.created",
                "seen": ["a", null, {"hex": "6e756c00"}],
                "hex:ff00": {"hex": "0100"},
            })
        );
        let mut any = Decoding::with_ids(IdRules::header("ce_type"));
        any.ids.format = IdFormat::Any;
        assert_eq!(
            JsonPayload::decode_with(&r, &any).unwrap().id,
            "\"order.created\""
        );
        let binary = Decoding::with_ids(IdRules::header("seen"));
        r.headers.retain(|h| h.key != "seen".as_bytes());
        r.headers.push(h(b"seen", Some(b"\xfe")));
        assert_eq!(
            JsonPayload::decode_with(&r, &binary).unwrap().id,
            "{\"hex\":\"fe\"}"
        );
    }

    #[test]
    fn tombstones_and_value_formats() {
        let mut d = Decoding::default();
        let mut tomb = raw(0, None, "");
        tomb.payload = None;
        assert_eq!(
            JsonPayload::decode_with(&tomb, &d).unwrap_err().0,
            Reason::EmptyPayload
        );
        d.tombstones = Tombstones::Pass;
        for values in [ValueFormat::Json, ValueFormat::Text, ValueFormat::Bytes] {
            d.values = values;
            let p = JsonPayload::decode_with(&tomb, &d).unwrap();
            assert!(p.is_tombstone());
            assert_eq!(p.as_bytes(), b"null");
        }
        let value = |bytes: &[u8], values| {
            let mut r = raw(0, None, "");
            r.payload = Some(Bytes::copy_from_slice(bytes));
            let d = Decoding {
                values,
                ..Decoding::default()
            };
            JsonPayload::decode_with(&r, &d)
                .map(|p| String::from_utf8(p.as_bytes().to_vec()).unwrap())
                .map_err(|(reason, _)| reason)
        };
        assert_eq!(value(b"", ValueFormat::Json), Err(Reason::EmptyPayload));
        assert_eq!(value(b"", ValueFormat::Text).as_deref(), Ok("\"\""));
        assert_eq!(
            value(b"line \"1\"\n\xc3\xa9", ValueFormat::Text).as_deref(),
            Ok("\"line \\\"1\\\"\\n\u{e9}\"")
        );
        assert_eq!(
            value(b"\xff", ValueFormat::Text),
            Err(Reason::InvalidPayload)
        );
        assert_eq!(
            value(b"a\0", ValueFormat::Text),
            Err(Reason::InvalidPayload)
        );
        assert_eq!(
            value(b"\x00\xff", ValueFormat::Bytes).as_deref(),
            Ok("{\"hex\":\"00ff\"}")
        );
        assert_eq!(
            value(b"", ValueFormat::Bytes).as_deref(),
            Ok("{\"hex\":\"\"}")
        );
        assert_eq!(
            value(b"not json", ValueFormat::Json),
            Err(Reason::InvalidPayload)
        );
    }
}

//! The dead-letter row of a record: pure, no I/O.
//!
//! Invariant: every value of a [`Row`] can be stored whatever bytes the record held. Raw bytes go
//! to `bytea` columns (key, payload, the id header's value); text columns only ever receive
//! valid UTF-8 without NUL (PostgreSQL `text` refuses 0x00, SQLSTATE 22021; `jsonb` refuses
//! `\u0000`, 22P05), of bounded length where the text comes from the record:
//!
//! - `message_id`: the id, when it is valid UTF-8 without NUL of at most [`crate::pipeline::message::MAX_ID_TEXT_BYTES`]
//!   bytes, else NULL; `message_id_raw` holds the id header's value exactly as received;
//! - `detail`: NUL bytes written as `\0`, cut at a character boundary to at most
//!   [`MAX_DETAIL_BYTES`] bytes, ending with `…` when cut;
//! - `headers`: `[{"key": name, "value": value}]`, where a name that is not valid UTF-8 or holds
//!   a NUL is written `"key_hex"` instead of `"key"`, and such a value `"value_hex"` instead of
//!   `"value"` (lowercase hex of the bytes); a null value is `"value": null`. Lossless.
//!
//! A minimal row ([`RowForm::minimal`]) keeps position, timestamp, reason, key and payload only,
//! with a detail naming the SQLSTATE that refused the full row.

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use crate::pipeline::message::{clean_text, id_text, DeadLetter, IdRules, RawMessage};

/// Longest `detail` stored, in bytes.
pub const MAX_DETAIL_BYTES: usize = 1_000;

/// How the dead-letter rows of one transaction are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowForm<'a> {
    /// The id rules: the id as received goes to `message_id_raw`.
    pub ids: &'a IdRules,
    /// `Some(sqlstate)`: the full rows were refused with this SQLSTATE; write minimal rows.
    pub refused: Option<&'a str>,
}

impl<'a> RowForm<'a> {
    /// Full rows, reading the id as `ids` say.
    pub fn full(ids: &'a IdRules) -> Self {
        Self { ids, refused: None }
    }

    /// Minimal rows, after the full ones were refused with `sqlstate`.
    pub fn minimal(ids: &'a IdRules, sqlstate: &'a str) -> Self {
        Self {
            ids,
            refused: Some(sqlstate),
        }
    }
}

/// The values of one `dead_letters` row (besides topic and partition, shared by the batch).
#[derive(Debug, Clone, PartialEq)]
pub struct Row<'a> {
    /// Kafka offset.
    pub offset: i64,
    /// The id as text, when it is clean and short (see the module's rules).
    pub message_id: Option<&'a str>,
    /// The id as received (the id header's value, or the key).
    pub message_id_raw: Option<&'a [u8]>,
    /// The reason's stored text.
    pub reason: &'a str,
    /// The storable detail.
    pub detail: String,
    /// Record key.
    pub key: Option<&'a [u8]>,
    /// Record value.
    pub payload: Option<&'a [u8]>,
    /// Headers as JSON (`None` in a minimal row).
    pub headers: Option<Value>,
    /// The record's Kafka timestamp, in milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
}

/// The row of `letter` in `form`.
pub fn row<'a>(letter: &'a DeadLetter, form: RowForm<'_>) -> Row<'a> {
    let raw = &*letter.raw;
    let minimal = Row {
        offset: raw.offset,
        message_id: None,
        message_id_raw: None,
        reason: letter.reason.as_str(),
        detail: String::new(),
        key: raw.key.as_deref(),
        payload: raw.payload.as_deref(),
        headers: None,
        timestamp_ms: raw.timestamp_ms,
    };
    match form.refused {
        Some(sqlstate) => Row {
            detail: format!(
                "the full dead-letter row was refused (SQLSTATE {}); reason, key and payload \
                 are kept",
                storable_detail(sqlstate)
            ),
            ..minimal
        },
        None => Row {
            message_id: letter
                .message_id
                .as_deref()
                .and_then(|id| id_text(id.as_bytes())),
            message_id_raw: form.ids.original(raw),
            detail: storable_detail(&letter.detail),
            headers: Some(headers_json(raw)),
            ..minimal
        },
    }
}

/// `detail` with NUL written as `\0`, cut at a character boundary to [`MAX_DETAIL_BYTES`]
/// (ending with `…` when cut).
pub(crate) fn storable_detail(detail: &str) -> String {
    const CUT: &str = "…";
    // Escaping at most doubles a text: look at no more than the limit's worth of input.
    let head = &detail[..floor_char_boundary(detail, MAX_DETAIL_BYTES)];
    let escaped = head.replace('\0', "\\0");
    if head.len() == detail.len() && escaped.len() <= MAX_DETAIL_BYTES {
        return escaped;
    }
    let end = floor_char_boundary(&escaped, MAX_DETAIL_BYTES - CUT.len());
    format!("{}{CUT}", &escaped[..end])
}

/// The largest character boundary of `text` at or below `max`.
fn floor_char_boundary(text: &str, max: usize) -> usize {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// Headers as JSON, losslessly and storably (see the module's rules).
pub(crate) fn headers_json(raw: &RawMessage) -> Value {
    let headers = raw.headers.iter().map(|h| {
        let mut entry = Map::with_capacity(2);
        match clean_text(&h.key) {
            Some(name) => entry.insert("key".to_owned(), json!(name)),
            None => entry.insert("key_hex".to_owned(), json!(hex(&h.key))),
        };
        match h.value.as_deref().map(|v| (v, clean_text(v))) {
            None => entry.insert("value".to_owned(), Value::Null),
            Some((_, Some(text))) => entry.insert("value".to_owned(), json!(text)),
            Some((bytes, None)) => entry.insert("value_hex".to_owned(), json!(hex(bytes))),
        };
        Value::Object(entry)
    });
    Value::Array(headers.collect())
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len().saturating_mul(2));
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::pipeline::message::Header;
    use crate::reason::Reason;

    fn header(key: &'static [u8], value: Option<&'static [u8]>) -> Header {
        Header {
            key: Bytes::from_static(key),
            value: value.map(Bytes::from_static),
        }
    }

    fn letter(headers: Vec<Header>, message_id: Option<&str>, detail: &str) -> DeadLetter {
        let mut raw = crate::pipeline::message::tests::raw(7, None, "v");
        raw.headers = headers;
        DeadLetter::new(
            Arc::new(raw),
            message_id.map(str::to_owned),
            Reason::InvalidId,
            detail.to_owned(),
        )
    }

    #[test]
    fn headers_are_kept_losslessly_and_storably() {
        let l = letter(
            vec![
                header(b"id", Some(b"x")),
                header(b"bin", Some(&[0xff, 0x00])),
                header(b"nul", Some(b"a\0b")),
                header(b"null", None),
                header(b"", Some(b"")),
                header(&[0xc3, 0x28], Some(b"v")),
            ],
            None,
            "",
        );
        assert_eq!(
            headers_json(&l.raw),
            json!([
                {"key": "id", "value": "x"},
                {"key": "bin", "value_hex": "ff00"},
                {"key": "nul", "value_hex": "610062"},
                {"key": "null", "value": null},
                {"key": "", "value": ""},
                {"key_hex": "c328", "value": "v"},
            ])
        );
    }

    #[test]
    fn the_id_header_is_kept_raw_and_as_text_only_when_clean_and_short() {
        let nul = letter(vec![header(b"id", Some(b"abc\0def"))], None, "");
        let r = row(&nul, RowForm::full(&IdRules::header("id")));
        assert_eq!(r.message_id_raw, Some(&b"abc\0def"[..]));
        assert_eq!(r.message_id, None);
        let long = "x".repeat(crate::pipeline::message::MAX_ID_TEXT_BYTES + 1);
        assert_eq!(id_text(long.as_bytes()), None);
        assert_eq!(id_text(&long.as_bytes()[1..]), Some(&long[1..]));
        assert_eq!(id_text(b"a\0"), None);
        assert_eq!(id_text(&[0xff]), None);
        let unclean = letter(vec![], Some("a\0b"), "");
        assert_eq!(
            row(&unclean, RowForm::full(&IdRules::header("id"))).message_id,
            None
        );
    }

    #[test]
    fn details_lose_their_nul_bytes_and_are_cut_at_a_character_boundary() {
        assert_eq!(storable_detail("a\0b"), "a\\0b");
        let exact = "é".repeat(MAX_DETAIL_BYTES / 2);
        assert_eq!(storable_detail(&exact), exact, "exactly at the limit: kept");
        let long = format!("{exact}x");
        let cut = storable_detail(&long);
        assert!(cut.len() <= MAX_DETAIL_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…') && cut.starts_with("éé"));
        let nuls = "\0".repeat(MAX_DETAIL_BYTES);
        let cut = storable_detail(&nuls);
        assert!(cut.len() <= MAX_DETAIL_BYTES && !cut.contains('\0'));
    }

    #[test]
    fn a_minimal_row_keeps_position_reason_key_and_payload_only() {
        let l = letter(vec![header(b"id", Some(b"abc"))], Some("abc"), "why");
        let r = row(&l, RowForm::minimal(&IdRules::header("id"), "23514"));
        assert_eq!(
            (
                r.offset,
                r.reason,
                r.payload,
                r.message_id,
                r.message_id_raw
            ),
            (7, "invalid_id", Some(&b"v"[..]), None, None)
        );
        assert_eq!(r.headers, None);
        assert!(r.detail.contains("SQLSTATE 23514"), "{}", r.detail);
    }
}

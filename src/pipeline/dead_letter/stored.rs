//! Dead letters read back from the database: the record as it was delivered (for a redrive),
//! and the fields `dead-letters list` shows.
//!
//! Invariant: a stored row turns back into the record it was written from (module `row`'s
//! rules read in reverse): key, value, Kafka timestamp and headers (names and values as text, as
//! hex, or null) exactly as received, so a re-driven message decodes and reaches the handler as
//! it first would have. A minimal row has no headers: it comes back without its id header.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio_postgres::Row as PgRow;

use crate::pipeline::message::{Header, RawMessage};

/// Where a record was in Kafka: the dead letter's key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// A dead letter waiting for a redrive, read with the columns of
/// [`crate::db::sql::redrive::LOCK_PARKED`].
#[derive(Debug, Clone)]
pub(crate) struct Parked {
    /// The record as delivered.
    pub raw: Arc<RawMessage>,
}

impl Parked {
    /// Reads one row of [`crate::db::sql::redrive::LOCK_PARKED`].
    pub(crate) fn from_row(row: &PgRow) -> Result<Self, tokio_postgres::Error> {
        let topic: String = row.try_get(0)?;
        let headers: Option<Value> = row.try_get(7)?;
        let raw = RawMessage {
            topic: Arc::from(topic),
            partition: row.try_get(1)?,
            offset: row.try_get(2)?,
            timestamp_ms: row.try_get(8)?,
            key: row.try_get::<_, Option<Vec<u8>>>(5)?.map(Bytes::from),
            payload: row.try_get::<_, Option<Vec<u8>>>(6)?.map(Bytes::from),
            headers: headers.as_ref().map(headers_of).unwrap_or_default(),
            header_error: None,
        };
        Ok(Self { raw: Arc::new(raw) })
    }

    /// Its position.
    pub(crate) fn position(&self) -> Position {
        Position {
            topic: self.raw.topic.to_string(),
            partition: self.raw.partition,
            offset: self.raw.offset,
        }
    }
}

/// The headers of a stored `headers` value ([`super::headers_json`] read in reverse). An entry
/// that is not one of its forms is skipped: it cannot have been written by the pipeline.
pub(crate) fn headers_of(json: &Value) -> Vec<Header> {
    let Some(entries) = json.as_array() else {
        return Vec::new();
    };
    entries.iter().filter_map(header_of).collect()
}

fn header_of(entry: &Value) -> Option<Header> {
    let key = match (entry.get("key"), entry.get("key_hex")) {
        (Some(Value::String(k)), _) => Bytes::copy_from_slice(k.as_bytes()),
        (_, Some(Value::String(h))) => Bytes::from(unhex(h)?),
        _ => return None,
    };
    let value = match (entry.get("value"), entry.get("value_hex")) {
        (Some(Value::String(v)), _) => Some(Bytes::copy_from_slice(v.as_bytes())),
        (_, Some(Value::String(h))) => Some(Bytes::from(unhex(h)?)),
        (Some(Value::Null), _) => None,
        _ => return None,
    };
    Some(Header { key, value })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One dead letter as `dead-letters list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its position.
    pub position: Position,
    /// The id as stored (text; it may not be a UUID, or be missing).
    pub message_id: Option<String>,
    /// Why it was parked.
    pub reason: String,
    /// The detail (the latest failure's, after a redrive that failed again).
    pub detail: Option<String>,
    /// When it was written, UTC, RFC 3339 with milliseconds.
    pub created_at: String,
    /// When a redrive applied it, found it a duplicate or saw it rejected.
    pub redriven_at: Option<String>,
    /// `applied`, `duplicate` or `rejected`, once re-driven.
    pub redrive_outcome: Option<String>,
    /// Redrive attempts so far.
    pub redrive_attempts: i32,
}

impl Listed {
    /// Reads one row of [`crate::db::sql::redrive::LIST`] (or `PREVIEW_PARKED`).
    pub(crate) fn from_row(row: &PgRow) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            position: Position {
                topic: row.try_get(0)?,
                partition: row.try_get(1)?,
                offset: row.try_get(2)?,
            },
            message_id: row.try_get(3)?,
            reason: row.try_get(4)?,
            detail: row.try_get(5)?,
            created_at: row.try_get(6)?,
            redriven_at: row.try_get(7)?,
            redrive_outcome: row.try_get(8)?,
            redrive_attempts: row.try_get(9)?,
        })
    }

    /// The redrive state in words: `applied 2025-…`, `parked (2 attempts)`, `parked`.
    pub fn redrive_state(&self) -> String {
        match (&self.redrive_outcome, &self.redriven_at) {
            (Some(outcome), Some(at)) => format!("{outcome} {at}"),
            _ if self.redrive_attempts > 0 => format!(
                "parked ({} failed attempt{})",
                self.redrive_attempts,
                if self.redrive_attempts == 1 { "" } else { "s" }
            ),
            _ => "parked".to_owned(),
        }
    }

    /// One JSON object: position fields, id, reason, detail, created_at and the redrive state.
    pub fn to_json(&self) -> Value {
        json!({
            "topic": self.position.topic,
            "partition": self.position.partition,
            "offset": self.position.offset,
            "message_id": self.message_id,
            "reason": self.reason,
            "detail": self.detail,
            "created_at": self.created_at,
            "redriven_at": self.redriven_at,
            "redrive_outcome": self.redrive_outcome,
            "redrive_attempts": self.redrive_attempts,
        })
    }
}

/// Longest detail in a table cell, in characters (`--json` shows it whole).
const TABLE_DETAIL_CHARS: usize = 80;

/// `letters` as a text table with a header line: position, id, reason, redrive state, created
/// at and detail (on one line, cut to 80 characters).
pub fn table(letters: &[Listed]) -> String {
    let cells: Vec<[String; 6]> = letters
        .iter()
        .map(|l| {
            [
                l.position.to_string(),
                l.message_id.clone().unwrap_or_else(|| "-".to_owned()),
                l.reason.clone(),
                l.redrive_state(),
                l.created_at.clone(),
                one_line(l.detail.as_deref().unwrap_or(""), TABLE_DETAIL_CHARS),
            ]
        })
        .collect();
    let head = [
        "POSITION",
        "ID",
        "REASON",
        "REDRIVE",
        "CREATED_AT",
        "DETAIL",
    ]
    .map(str::to_owned);
    let mut widths = head.clone().map(|h| h.chars().count());
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&head).chain(&cells) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `text` on one line (whitespace runs as one space), cut to `max` characters with `…`.
fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max) {
        None => flat,
        Some((end, _)) => format!("{}…", &flat[..end]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::dead_letter::headers_json;

    #[test]
    fn stored_headers_come_back_as_received() {
        let mut raw = crate::pipeline::message::tests::raw(0, Some("x"), "v");
        raw.headers.extend([
            Header {
                key: Bytes::from_static(&[0xc3, 0x28]),
                value: Some(Bytes::from_static(&[0xff, 0x00])),
            },
            Header {
                key: Bytes::from_static(b"null"),
                value: None,
            },
            Header {
                key: Bytes::new(),
                value: Some(Bytes::new()),
            },
        ]);
        assert_eq!(headers_of(&headers_json(&raw)), raw.headers);
        assert_eq!(headers_of(&json!([{"key": "a", "value_hex": "0"}])), vec![]);
        assert_eq!(headers_of(&Value::Null), vec![]);
    }

    #[test]
    fn a_table_has_a_header_and_one_line_per_letter() {
        let letter = Listed {
            position: Position {
                topic: "t".to_owned(),
                partition: 1,
                offset: 7,
            },
            message_id: Some("abc".to_owned()),
            reason: "invalid_id".to_owned(),
            detail: Some("line one\nline two".to_owned()),
            created_at: "2025-06-01T00:00:00.000Z".to_owned(),
            redriven_at: None,
            redrive_outcome: None,
            redrive_attempts: 2,
        };
        let text = table(&[letter]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("POSITION  ID   REASON"), "{text}");
        assert!(
            lines[1].starts_with("t/1/7     abc  invalid_id  parked (2 failed attempts)"),
            "{text}"
        );
        assert!(lines[1].ends_with("line one line two"), "{text}");
        assert_eq!(one_line(&"é".repeat(5), 3), "ééé…");
    }
}

//! Dead-letter records: every message that is not applied, with the reason, kept forever.
//!
//! Invariant: dead letters are written in the same transaction as the batch they belong to, keyed
//! by (topic, partition, offset), so a redelivered batch adds no second record.

use std::sync::Arc;

use crate::Transaction;
use serde_json::{json, Value};

use crate::message::RawMessage;

/// Why a message was not applied. The text form is stored in `dead_letters.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No id header, or a null one.
    MissingId,
    /// The id header is not a UUID.
    InvalidId,
    /// The record has no value, or an empty one.
    EmptyPayload,
    /// The value is not the expected JSON, or has wrong types.
    InvalidPayload,
    /// The ledger rejected a debit that would take the balance below zero.
    InsufficientFunds,
    /// The ledger rejected an amount that would overflow the balance.
    AmountOverflow,
    /// The handler failed on this message alone for a reason retrying cannot fix (a poison
    /// message, isolated by bisecting its batch); `detail` holds the error.
    HandlerError,
}

impl Reason {
    /// The stable text stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MissingId => "missing_id",
            Reason::InvalidId => "invalid_id",
            Reason::EmptyPayload => "empty_payload",
            Reason::InvalidPayload => "invalid_payload",
            Reason::InsufficientFunds => "insufficient_funds",
            Reason::AmountOverflow => "amount_overflow",
            Reason::HandlerError => "handler_error",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A message that is recorded instead of applied.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The record as delivered.
    pub raw: Arc<RawMessage>,
    /// The id header's text, when there was one (it may not be a valid UUID).
    pub message_id: Option<String>,
    /// Why it was not applied.
    pub reason: Reason,
    /// Human-readable detail (the parse error, the balance that was too low).
    pub detail: String,
}

impl DeadLetter {
    /// Builds a dead letter for `raw`.
    pub fn new(
        raw: Arc<RawMessage>,
        message_id: Option<String>,
        reason: Reason,
        detail: String,
    ) -> Self {
        Self {
            raw,
            message_id,
            reason,
            detail,
        }
    }
}

/// Headers as JSON, losslessly: `[{"key": k, "value": utf8}]`, or `"value_hex"` for binary values.
pub fn headers_json(raw: &RawMessage) -> Value {
    let headers = raw.headers.iter().map(|h| match &h.value {
        None => json!({ "key": h.key, "value": null }),
        Some(v) => match std::str::from_utf8(v) {
            Ok(text) => json!({ "key": h.key, "value": text }),
            Err(_) => json!({ "key": h.key, "value_hex": hex(v) }),
        },
    });
    Value::Array(headers.collect())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

const INSERT_DEAD_LETTERS: &str = "\
INSERT INTO dead_letters (topic, partition, \"offset\", message_id, reason, detail, key, payload, headers)
SELECT $1, $2, o, m, r, d, k, p, h
FROM unnest($3::bigint[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::bytea[], $9::jsonb[])
     AS t(o, m, r, d, k, p, h)
ON CONFLICT (topic, partition, \"offset\") DO NOTHING";

/// Writes the dead letters of one partition's batch in one statement; returns rows inserted
/// (fewer than `letters.len()` when some were already recorded by an earlier delivery).
pub async fn insert(
    tx: &Transaction<'_>,
    topic: &str,
    partition: i32,
    letters: &[DeadLetter],
) -> Result<u64, tokio_postgres::Error> {
    if letters.is_empty() {
        return Ok(0);
    }
    let offsets: Vec<i64> = letters.iter().map(|d| d.raw.offset).collect();
    let ids: Vec<Option<&str>> = letters.iter().map(|d| d.message_id.as_deref()).collect();
    let reasons: Vec<&str> = letters.iter().map(|d| d.reason.as_str()).collect();
    let details: Vec<&str> = letters.iter().map(|d| d.detail.as_str()).collect();
    let keys: Vec<Option<&[u8]>> = letters.iter().map(|d| d.raw.key.as_deref()).collect();
    let payloads: Vec<Option<&[u8]>> = letters.iter().map(|d| d.raw.payload.as_deref()).collect();
    let headers: Vec<Value> = letters.iter().map(|d| headers_json(&d.raw)).collect();
    let stmt = tx.prepare_cached(INSERT_DEAD_LETTERS).await?;
    tx.execute(
        &stmt,
        &[
            &topic, &partition, &offsets, &ids, &reasons, &details, &keys, &payloads, &headers,
        ],
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Header;
    use bytes::Bytes;

    #[test]
    fn headers_are_kept_losslessly() {
        let mut raw = crate::message::tests::raw(0, Some("x"), "");
        raw.headers.push(Header {
            key: "bin".into(),
            value: Some(Bytes::from_static(&[0xff, 0x00])),
        });
        raw.headers.push(Header {
            key: "null".into(),
            value: None,
        });
        assert_eq!(
            headers_json(&raw),
            json!([
                {"key": "id", "value": "x"},
                {"key": "bin", "value_hex": "ff00"},
                {"key": "null", "value": null},
            ])
        );
    }
}

//! Dead-letter records: every message that is not applied, with the reason, kept forever.
//!
//! Invariant: dead letters are written in the same transaction as the batch they belong to, keyed
//! by (topic, partition, offset), so a redelivered batch adds no second record. Whatever bytes a
//! record holds, its row can be stored (module `row`).

use std::sync::Arc;

use crate::Transaction;
use serde_json::Value;

use crate::message::RawMessage;

mod row;

pub use row::{
    headers_json, id_text, row, storable_detail, Row, RowForm, MAX_DETAIL_BYTES, MAX_ID_TEXT_BYTES,
};

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
    /// The id is a UUIDv7 older than the inbox retention: its inbox row may already be removed,
    /// so the message cannot be proven new and is not applied.
    OutsideDedupWindow,
}

impl Reason {
    /// Every reason, in a fixed order (the index of [`ReasonCounts`]).
    pub const ALL: [Reason; 8] = [
        Reason::MissingId,
        Reason::InvalidId,
        Reason::EmptyPayload,
        Reason::InvalidPayload,
        Reason::InsufficientFunds,
        Reason::AmountOverflow,
        Reason::HandlerError,
        Reason::OutsideDedupWindow,
    ];

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
            Reason::OutsideDedupWindow => "outside_dedup_window",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// `ReasonCounts` indexes by discriminant: the last variant must be the last of `ALL` (the unit
// test checks every position).
const _: () = assert!(Reason::OutsideDedupWindow as usize + 1 == Reason::ALL.len());

/// Dead letters of one transaction, counted by reason (indexed like [`Reason::ALL`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReasonCounts(pub [u64; Reason::ALL.len()]);

impl ReasonCounts {
    /// Counts `letters` by reason.
    pub fn of(letters: &[DeadLetter]) -> Self {
        let mut counts = Self::default();
        for letter in letters {
            counts.0[letter.reason as usize] += 1;
        }
        counts
    }

    /// Each reason with its count.
    pub fn iter(&self) -> impl Iterator<Item = (Reason, u64)> + '_ {
        Reason::ALL.into_iter().zip(self.0)
    }
}

/// A message that is recorded instead of applied.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The record as delivered.
    pub raw: Arc<RawMessage>,
    /// The id as text: the UUID when it parsed, else the id header's value when it is clean
    /// text (see [`id_text`]; it may not be a valid UUID).
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

const INSERT_DEAD_LETTERS: &str = "\
INSERT INTO dead_letters (topic, partition, \"offset\", message_id, message_id_raw, reason, detail, key, payload, headers)
SELECT $1, $2, o, m, mr, r, d, k, p, h
FROM unnest($3::bigint[], $4::text[], $5::bytea[], $6::text[], $7::text[], $8::bytea[], $9::bytea[], $10::jsonb[])
     AS t(o, m, mr, r, d, k, p, h)
ON CONFLICT (topic, partition, \"offset\") DO NOTHING";

/// Writes the dead letters of one partition's batch in one statement, as rows of `form`;
/// returns rows inserted (fewer than `letters.len()` when some were already recorded by an
/// earlier delivery).
pub async fn insert(
    tx: &Transaction<'_>,
    topic: &str,
    partition: i32,
    letters: &[DeadLetter],
    form: RowForm<'_>,
) -> Result<u64, tokio_postgres::Error> {
    if letters.is_empty() {
        return Ok(0);
    }
    let rows: Vec<Row<'_>> = letters.iter().map(|d| row(d, form)).collect();
    let offsets: Vec<i64> = rows.iter().map(|r| r.offset).collect();
    let ids: Vec<Option<&str>> = rows.iter().map(|r| r.message_id).collect();
    let raw_ids: Vec<Option<&[u8]>> = rows.iter().map(|r| r.message_id_raw).collect();
    let reasons: Vec<&str> = rows.iter().map(|r| r.reason).collect();
    let details: Vec<&str> = rows.iter().map(|r| r.detail.as_str()).collect();
    let keys: Vec<Option<&[u8]>> = rows.iter().map(|r| r.key).collect();
    let payloads: Vec<Option<&[u8]>> = rows.iter().map(|r| r.payload).collect();
    let headers: Vec<Option<&Value>> = rows.iter().map(|r| r.headers.as_ref()).collect();
    let stmt = tx.prepare_cached(INSERT_DEAD_LETTERS).await?;
    tx.execute(
        &stmt,
        &[
            &topic, &partition, &offsets, &ids, &raw_ids, &reasons, &details, &keys, &payloads,
            &headers,
        ],
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_counted_at_its_own_index() {
        let names: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len(), "no reason twice");
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(reason as usize, i, "{reason}");
        }
    }
}

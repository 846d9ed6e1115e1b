//! Dead-letter records: every message that is not applied, with the reason, kept forever.
//!
//! Invariant: dead letters are written in the same transaction as the batch they belong to, keyed
//! by (topic, partition, offset), so a redelivered batch adds no second record. Whatever bytes a
//! record holds, its row can be stored (module `row`).

use crate::db::Transaction;
use serde_json::Value;

use crate::db::sql::INSERT_DEAD_LETTERS;
use crate::pipeline::message::DeadLetter;

mod row;
pub(crate) mod stored;

#[cfg(test)]
pub(crate) use row::headers_json;
pub(crate) use row::storable_detail;
pub use row::MAX_DETAIL_BYTES;
pub use row::{row, Row, RowForm};
pub(crate) use stored::Parked;
pub use stored::{Listed, Position};

/// Writes the dead letters of one partition's batch in one statement, as rows of `form`;
/// returns rows inserted (fewer than `letters.len()` when some were already recorded by an
/// earlier delivery).
pub(crate) async fn insert(
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
    let timestamps: Vec<Option<i64>> = rows.iter().map(|r| r.timestamp_ms).collect();
    let stmt = tx.prepare_cached(INSERT_DEAD_LETTERS).await?;
    tx.execute(
        &stmt,
        &[
            &topic,
            &partition,
            &offsets,
            &ids,
            &raw_ids,
            &reasons,
            &details,
            &keys,
            &payloads,
            &headers,
            &timestamps,
        ],
    )
    .await
}

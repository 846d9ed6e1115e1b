//! Offsets in the database: the `consumer_offsets` table, written in each batch's transaction.
//!
//! Invariant: a partition's stored `next_offset` only moves forward, and is written only inside
//! the transaction that commits every record before it; so after any crash it is a position from
//! which nothing committed is read again and nothing uncommitted is skipped.

use std::collections::HashMap;

use deadpool_postgres::Pool;

use crate::db::Transaction;
use crate::error::InboxError;
use crate::sql::{READ_OFFSETS as READ, READ_TOPIC_OFFSETS as READ_TOPIC, UPSERT_OFFSET as UPSERT};

/// Where a transaction records its partition's next offset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OffsetTarget<'a> {
    /// Consumer group.
    pub group: &'a str,
    /// The offset after the transaction's last record.
    pub next_offset: i64,
}

/// Upserts `target` in its own statement (for transactions that have no inbox statement to
/// carry it).
pub(crate) async fn store(
    tx: &Transaction<'_>,
    topic: &str,
    partition: i32,
    target: OffsetTarget<'_>,
) -> Result<(), InboxError> {
    let stmt = tx.prepare_cached(UPSERT).await?;
    tx.execute(
        &stmt,
        &[&target.group, &topic, &partition, &target.next_offset],
    )
    .await?;
    Ok(())
}

/// The stored next offsets of `partitions` of `topic` for `group`.
pub(crate) async fn read(
    pool: &Pool,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> Result<HashMap<i32, i64>, InboxError> {
    let client = pool.get().await?;
    let rows = client.query(READ, &[&group, &topic, &partitions]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The stored next offset of every partition of `topic` for `group`.
pub(crate) async fn read_topic(
    pool: &Pool,
    group: &str,
    topic: &str,
) -> Result<HashMap<i32, i64>, InboxError> {
    let client = pool.get().await?;
    let rows = client.query(READ_TOPIC, &[&group, &topic]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

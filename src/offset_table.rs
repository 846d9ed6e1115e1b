//! Offsets in the database: the `consumer_offsets` table, written in each batch's transaction.
//!
//! Invariant: a partition's stored `next_offset` is written only inside the transaction that
//! commits every record before it, and only from the position its writer last committed (a
//! compare-and-set): so after any crash it is a position from which nothing committed is read
//! again and nothing uncommitted is skipped, and a database that went back in time (a restore, a
//! failover to a replica that lagged) is noticed by the next write instead of being overwritten.

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
    /// The position this member last committed for the partition (or started from): the row
    /// must hold it. `None`: no row known, the row may only be created or moved forward.
    pub expected: Option<i64>,
}

/// Whether the compare-and-set wrote: `inserted` is the `inserted` column of the upsert's row
/// (`None`: no row, nothing written).
pub(crate) fn check_written(
    target: &OffsetTarget<'_>,
    inserted: Option<bool>,
) -> Result<(), InboxError> {
    match inserted {
        Some(false) => Ok(()),
        Some(true) if target.expected.is_none() => Ok(()),
        _ => Err(InboxError::PositionMoved {
            expected: target.expected,
        }),
    }
}

/// Compares-and-sets `target` in its own statement (for transactions that have no inbox statement to
/// carry it).
pub(crate) async fn store(
    tx: &Transaction<'_>,
    topic: &str,
    partition: i32,
    target: OffsetTarget<'_>,
) -> Result<(), InboxError> {
    let stmt = tx.prepare_cached(UPSERT).await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
        &target.group,
        &topic,
        &partition,
        &target.next_offset,
        &target.expected,
    ];
    let row = tx.query_opt(&stmt, &params).await?;
    check_written(&target, row.map(|r| r.get(0)))
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

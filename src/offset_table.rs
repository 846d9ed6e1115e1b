//! Offsets in the database: the `consumer_offsets` table, written in each batch's transaction.
//!
//! Invariant: a partition's stored `next_offset` only moves forward, and is written only inside
//! the transaction that commits every record before it; so after any crash it is a position from
//! which nothing committed is read again and nothing uncommitted is skipped.

use std::collections::HashMap;

use deadpool_postgres::Pool;

use crate::error::InboxError;
use crate::Transaction;

/// The monotonic upsert of one partition's next offset, with its four parameters named by the
/// caller (so that it can be a data-modifying CTE of another statement).
macro_rules! upsert_offset {
    ($group:literal, $topic:literal, $partition:literal, $next:literal) => {
        concat!(
            "INSERT INTO consumer_offsets AS c (group_id, topic, partition, next_offset, updated_at) ",
            "VALUES (",
            $group, ", ", $topic, ", ", $partition, ", ", $next,
            ", now()) ON CONFLICT (group_id, topic, partition) DO UPDATE ",
            "SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at ",
            "WHERE c.next_offset < EXCLUDED.next_offset"
        )
    };
}
pub(crate) use upsert_offset;

const UPSERT: &str = upsert_offset!("$1", "$2", "$3", "$4");

const READ: &str = "\
SELECT partition, next_offset FROM consumer_offsets
WHERE group_id = $1 AND topic = $2 AND partition = ANY($3)";

const READ_TOPIC: &str = "\
SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2";

/// Where a transaction records its partition's next offset.
#[derive(Debug, Clone, Copy)]
pub struct OffsetTarget<'a> {
    /// Consumer group.
    pub group: &'a str,
    /// The offset after the transaction's last record.
    pub next_offset: i64,
}

/// Upserts `target` in its own statement (for transactions that have no inbox statement to
/// carry it).
pub async fn store(
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
pub async fn read(
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
pub async fn read_topic(
    pool: &Pool,
    group: &str,
    topic: &str,
) -> Result<HashMap<i32, i64>, InboxError> {
    let client = pool.get().await?;
    let rows = client.query(READ_TOPIC, &[&group, &topic]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

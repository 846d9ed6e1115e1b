//! Positions in the database: the `consumer_offsets` table, written in each batch's transaction
//! by the inbox and read by the sources that resume from it (Kafka's `resume`, the `--exit-on-eof`
//! check, an operator's `positions set`). A source's position is whatever it supplies as a
//! record's offset (module `source`): Kafka's offset, a JetStream stream sequence, a queue's own
//! count of deliveries. "Offsets in the database" lives here and nowhere else.
//!
//! Invariant: a partition's stored `next_offset` is written only inside the transaction that
//! commits every record before it, and only from the position its writer last committed (a
//! compare-and-set): so after any crash it is a position from which nothing committed is read
//! again and nothing uncommitted is skipped, and a database that went back in time (a restore, a
//! failover to a replica that lagged) is noticed by the next write instead of being overwritten.

use std::collections::HashMap;

use deadpool_postgres::Pool;

use crate::db::sql::{
    CLAIM_OFFSET as CLAIM, READ_OFFSETS as READ, READ_TOPIC_OFFSETS as READ_TOPIC,
    UPSERT_OFFSET as UPSERT,
};
use crate::db::Transaction;
use crate::error::InboxError;

/// The position a transaction's offset write left in the database, once it wrote.
#[derive(Debug, Default)]
pub(crate) struct Written(std::sync::Mutex<Option<i64>>);

impl Written {
    fn set(&self, next_offset: i64) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(next_offset);
    }

    /// The position stored by the write (`None`: nothing written).
    pub(crate) fn get(&self) -> Option<i64> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a transaction records its partition's next offset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OffsetTarget<'a> {
    /// Consumer group.
    pub group: &'a str,
    /// The offset after the transaction's last record.
    pub next_offset: i64,
    /// The position this member last committed for the partition (or started from): the row
    /// must hold it. `None`: no row known, the row may be created or moved forward.
    pub expected: Option<i64>,
    /// Where the write records the position it left (read after the COMMIT).
    pub written: &'a Written,
}

impl OffsetTarget<'_> {
    /// Records the position the write left (`None`: it wrote nothing), or fails with
    /// [`InboxError::PositionMoved`].
    pub(crate) fn check(&self, stored: Option<i64>) -> Result<(), InboxError> {
        match stored {
            Some(next) => {
                self.written.set(next);
                Ok(())
            }
            None => Err(InboxError::PositionMoved {
                expected: self.expected,
            }),
        }
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
    let stored = row.and_then(|r| {
        let inserted: bool = r.get(0);
        (!inserted || target.expected.is_none()).then(|| r.get(1))
    });
    target.check(stored)
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

/// The stored next offset of `partition` of `topic` for `group`, created at 0 when there is
/// none. A source without offsets of its own (a queue) starts each run from it, so that two
/// instances can never both write a first position unchecked: the compare-and-set of every
/// write then has a value to compare with.
pub(crate) async fn claim(
    pool: &Pool,
    group: &str,
    topic: &str,
    partition: i32,
) -> Result<i64, InboxError> {
    let client = pool.get().await?;
    client.execute(CLAIM, &[&group, &topic, &partition]).await?;
    let partitions = [partition];
    let rows = client
        .query(READ, &[&group, &topic, &&partitions[..]])
        .await?;
    // The row was there or is now: only a concurrent deletion (an operator's reset) can take it.
    rows.first()
        .map(|r| r.get(1))
        .ok_or(InboxError::PositionMoved { expected: None })
}

/// [`claim`], retried with the sources' backoff while the database fails (each failure a WARN
/// line naming `topic`); `None` once `stop` is cancelled.
pub(crate) async fn claim_until_stopped(
    pool: &Pool,
    group: &str,
    topic: &str,
    stop: &tokio_util::sync::CancellationToken,
) -> Option<i64> {
    let mut failures = 0u32;
    loop {
        match claim(pool, group, topic, 0).await {
            Ok(stored) => return Some(stored),
            Err(e) => {
                failures += 1;
                tracing::warn!(
                    topic,
                    "cannot read the position in the database, will retry: {e}"
                );
                let delay = std::time::Duration::from_millis(100u64 << failures.min(6))
                    .min(std::time::Duration::from_secs(5));
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
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

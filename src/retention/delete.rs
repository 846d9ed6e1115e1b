//! Removing expired rows one small batch at a time.
//!
//! Invariant: no statement here removes more than `batch_rows` rows or holds a lock for longer than
//! one such statement: each DELETE is its own transaction, locks only rows no one else holds
//! (`FOR UPDATE SKIP LOCKED`), finds them through the `processed_at` index (oldest first), and the
//! next one starts only after a pause, so the processor's transactions run in between.

use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::RetentionError;

/// What a batched delete did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Rows removed.
    pub rows: u64,
    /// DELETE statements run.
    pub statements: u64,
    /// The longest statement.
    pub longest: Duration,
}

/// Deletes the rows of `table` (the inbox, or its default partition) processed before `cutoff`,
/// at most `batch_rows` per statement with `pause` between statements, until none is left or
/// `stop` is cancelled.
pub async fn delete_expired(
    client: &Client,
    table: &str,
    cutoff: SystemTime,
    batch_rows: i64,
    pause: Duration,
    stop: &CancellationToken,
) -> Result<Deleted, RetentionError> {
    let sql = format!(
        "DELETE FROM {table} WHERE ctid = ANY(ARRAY(
             SELECT ctid FROM {table} WHERE processed_at < $1
             ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
    );
    let stmt = client.prepare(&sql).await?;
    let mut done = Deleted::default();
    loop {
        let started = Instant::now();
        let rows = client.execute(&stmt, &[&cutoff, &batch_rows]).await?;
        done.longest = done.longest.max(started.elapsed());
        done.rows += rows;
        done.statements += 1;
        if rows < batch_rows as u64 || stop.is_cancelled() {
            return Ok(done);
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(done),
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

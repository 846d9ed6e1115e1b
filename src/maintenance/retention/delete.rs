//! Removing expired rows one small batch at a time.
//!
//! A row is expired when it was processed before the cutoff and, for a UUIDv7, also created before
//! it. UUIDv7 rows are found through the primary key (their ids begin with their creation time,
//! so those created before the cutoff are one key range, oldest first); other rows through the
//! `inbox_processed_at` index, which holds only them (core migration 5).
//!
//! Invariant: no statement here removes more than `batch_rows` rows or holds a lock for longer than
//! one such statement: each DELETE is its own transaction, locks only rows no one else holds
//! (`FOR UPDATE SKIP LOCKED`), finds them through an index, and the next one starts only after a
//! pause, so the processor's transactions run in between.

use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::days::{unix_millis, uuid_at_millis};
use super::RetentionError;

/// The predicate of the partial `inbox_processed_at` index: the id is not a UUIDv7 (its version,
/// the high nibble of byte 6, is not 7). The queries that use the index repeat it verbatim.
pub const NOT_V7: &str = "get_byte(uuid_send(message_id), 6) >> 4 <> 7";

/// What a batched delete did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Deleted {
    /// Rows removed.
    pub rows: u64,
    /// DELETE statements run.
    pub statements: u64,
    /// The longest statement.
    pub longest: Duration,
}

/// Deletes the expired rows of `table` (the inbox, or its default partition): processed before
/// `cutoff` and, for UUIDv7 ids, created before it; at most `batch_rows` per statement with
/// `pause` between statements, until none is left or `stop` is cancelled.
pub(crate) async fn delete_expired(
    client: &Client,
    table: &str,
    cutoff: SystemTime,
    batch_rows: i64,
    pause: Duration,
    stop: &CancellationToken,
) -> Result<Deleted, RetentionError> {
    let sql = format!(
        "DELETE FROM {table} WHERE ctid = ANY(ARRAY(
             SELECT ctid FROM (SELECT ctid FROM {table}
                               WHERE message_id < $3 AND processed_at < $1 AND NOT ({NOT_V7})
                               ORDER BY message_id LIMIT $2 FOR UPDATE SKIP LOCKED) AS v7
             UNION ALL
             SELECT ctid FROM (SELECT ctid FROM {table} WHERE processed_at < $1 AND {NOT_V7}
                               ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS other
             LIMIT $2))"
    );
    let stmt = client.prepare(&sql).await?;
    let created_before = uuid_at_millis(unix_millis(cutoff));
    let mut done = Deleted::default();
    loop {
        let started = Instant::now();
        let rows = client
            .execute(&stmt, &[&cutoff, &batch_rows, &created_before])
            .await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partial_index_has_the_predicate_the_cleanup_repeats() {
        let migration = crate::db::MIGRATIONS
            .iter()
            .find(|m| m.name == "inbox_processed_at_not_v7")
            .expect("core migration 5");
        assert!(migration.sql.contains(NOT_V7), "{}", migration.sql);
    }
}

//! The partitioned inbox: range partitions by `message_id`, one per UTC day of UUIDv7 time, and a
//! default partition for every id outside the prepared days (UUIDv4 ids, clocks far off).
//!
//! Why by `message_id`: PostgreSQL enforces a primary key on a partitioned table only when the key
//! contains the partition key, and checks it per partition. Partitioned by `processed_at`, the key
//! would have to be `(message_id, processed_at)`, and a redelivered copy processed on another day
//! would land in another partition as a new row: the dedup would be lost. A UUIDv7 carries its
//! creation time, so every copy of an id falls in the same day's partition and `message_id` alone
//! stays the globally unique key.
//!
//! Invariants: every DDL statement runs under `lock_timeout` (a create or drop never queues the
//! processor's inserts behind it for longer), under one advisory lock (two maintainers never race);
//! rows of the default partition that fall into a new day are moved into it in the same
//! transaction; before an expired day is dropped, its rows that are not UUIDv7 and not expired by
//! `processed_at` (UUIDv4 ids whose random bits fell into that day) are re-inserted, so they land
//! in the default partition and keep their full retention.

use std::time::{Duration, SystemTime};

use deadpool_postgres::Client;
use tokio_postgres::error::SqlState;

use super::delete::NOT_V7;
use super::RetentionError;
use crate::days::{day_bounds, day_of_millis, day_of_partition, partition_name, unix_millis};
use crate::pipeline::defaults;

/// The default partition's name.
pub(crate) const DEFAULT_PARTITION: &str = "inbox_default";

/// Arbitrary constant identifying partition maintenance among advisory locks.
const PARTITION_LOCK: i64 = 0x6269_7061_7274_6974;

/// Attempts of one DDL step whose lock wait timed out, before it is postponed to the next run.
const DDL_ATTEMPTS: u32 = 5;

/// Oldest day given its own partition when a plain inbox is converted.
const CONVERT_DAYS_BACK: i64 = 366;

/// How the inbox table is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One table (`migrate`).
    Plain,
    /// Range-partitioned by `message_id` (`migrate --partitioned`).
    Partitioned,
}

/// The inbox's layout.
pub async fn layout(client: &Client) -> Result<Layout, RetentionError> {
    let row = client
        .query_opt(
            "SELECT relkind::text FROM pg_class WHERE oid = to_regclass('inbox')",
            &[],
        )
        .await?;
    match row.map(|r| r.get::<_, String>(0)).as_deref() {
        Some("p") => Ok(Layout::Partitioned),
        Some(_) => Ok(Layout::Plain),
        None => Err(RetentionError::NoInbox),
    }
}

/// The days that have a partition, ascending.
pub async fn partition_days(client: &Client) -> Result<Vec<i64>, RetentionError> {
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'inbox'::regclass",
            &[],
        )
        .await?;
    let mut days: Vec<i64> = rows
        .iter()
        .filter_map(|r| day_of_partition(r.get::<_, &str>(0)))
        .collect();
    days.sort_unstable();
    Ok(days)
}

/// What a conversion to the partitioned layout did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversion {
    /// Rows copied from the plain table (all of them).
    pub rows: u64,
    /// Day partitions created.
    pub partitions: usize,
}

/// Converts a plain inbox to the partitioned layout in one transaction, keeping every row; does
/// nothing (`Ok(None)`) when it is already partitioned. Day partitions are created from the
/// oldest UUIDv7 row of the last year to `ahead` days after `today`; older ids and UUIDv4 ids go to
/// the default partition. It holds an exclusive lock on the inbox while it copies: stop the
/// processors first (a million rows take seconds).
pub async fn convert(
    client: &mut Client,
    today: i64,
    ahead: u32,
) -> Result<Option<Conversion>, RetentionError> {
    check_ahead(ahead)?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PARTITION_LOCK])
        .await?;
    tx.batch_execute("SET LOCAL lock_timeout = '10s'; LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
        .await?;
    let kind: String = tx
        .query_one(
            "SELECT relkind::text FROM pg_class WHERE oid = 'inbox'::regclass",
            &[],
        )
        .await?
        .get(0);
    if kind == "p" {
        return Ok(None);
    }
    tx.batch_execute(&format!(
        "ALTER TABLE inbox RENAME TO inbox_unpartitioned;
         ALTER INDEX inbox_pkey RENAME TO inbox_unpartitioned_pkey;
         ALTER INDEX IF EXISTS inbox_processed_at RENAME TO inbox_unpartitioned_processed_at;
         CREATE TABLE inbox (LIKE inbox_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
             PARTITION BY RANGE (message_id);
         ALTER TABLE inbox ADD CONSTRAINT inbox_pkey PRIMARY KEY (message_id);
         CREATE INDEX inbox_processed_at ON inbox (processed_at) WHERE {NOT_V7};
         CREATE TABLE inbox_default PARTITION OF inbox DEFAULT;",
    ))
    .await?;
    let last = today + i64::from(ahead);
    let first = oldest_v7_day(&tx, today, last).await?.unwrap_or(today);
    for day in first..=last {
        let (from, to) = day_bounds(day);
        let name = partition_name(day);
        tx.batch_execute(&format!(
            "CREATE TABLE {name} PARTITION OF inbox FOR VALUES FROM ('{from}') TO ('{to}')"
        ))
        .await?;
    }
    let expected: i64 = tx
        .query_one("SELECT count(*) FROM inbox_unpartitioned", &[])
        .await?
        .get(0);
    let rows = tx
        .execute("INSERT INTO inbox SELECT * FROM inbox_unpartitioned", &[])
        .await?;
    if rows != expected as u64 {
        return Err(RetentionError::CopyMismatch { expected, rows });
    }
    tx.batch_execute("DROP TABLE inbox_unpartitioned").await?;
    tx.commit().await?;
    Ok(Some(Conversion {
        rows,
        partitions: (last - first + 1) as usize,
    }))
}

/// The day of the oldest UUIDv7 of the plain inbox, among the last year and up to `last`, but not
/// after `today`.
async fn oldest_v7_day(
    tx: &deadpool_postgres::Transaction<'_>,
    today: i64,
    last: i64,
) -> Result<Option<i64>, RetentionError> {
    let (lo, _) = day_bounds(today - CONVERT_DAYS_BACK);
    let (_, hi) = day_bounds(last);
    let oldest: Option<uuid::Uuid> = tx
        .query_opt(
            "SELECT message_id FROM inbox_unpartitioned
             WHERE message_id >= $1 AND message_id < $2
               AND get_byte(uuid_send(message_id), 6) >> 4 = 7
             ORDER BY message_id LIMIT 1",
            &[&lo, &hi],
        )
        .await?
        .map(|r| r.get(0));
    Ok(oldest
        .and_then(|id| crate::days::v7_millis(&id))
        .map(|ms| day_of_millis(ms).min(today)))
}

/// One partition DDL step, retried when its lock wait times out.
#[derive(Debug, Clone, Copy)]
enum Ddl {
    /// Create the partition of a day, moving its rows out of the default partition.
    Create(i64),
    /// Drop the partition of an expired day, keeping its young non-UUIDv7 rows.
    Drop { day: i64, cutoff: SystemTime },
}

/// Outcome of one DDL step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdlOutcome {
    /// Done; the count of rows moved (create) or kept (drop).
    Done(u64),
    /// Every attempt timed out waiting for its lock: left for the next run.
    Postponed,
}

/// Creates the partition of `day` (unless it exists), moving the default partition's rows of that
/// day into it.
pub async fn create_day(
    client: &mut Client,
    day: i64,
    lock_timeout: Duration,
) -> Result<DdlOutcome, RetentionError> {
    with_lock_retries(client, Ddl::Create(day), lock_timeout).await
}

/// Drops the partition of `day`, re-inserting first its rows that are not UUIDv7 and were
/// processed at or after `cutoff` (they go to the default partition).
pub(crate) async fn drop_day(
    client: &mut Client,
    day: i64,
    cutoff: SystemTime,
    lock_timeout: Duration,
) -> Result<DdlOutcome, RetentionError> {
    with_lock_retries(client, Ddl::Drop { day, cutoff }, lock_timeout).await
}

/// The days whose partitions hold only ids older than `cutoff` (their whole range ends by then).
pub(crate) fn expired_days(days: &[i64], cutoff: SystemTime) -> Vec<i64> {
    let cutoff_ms = unix_millis(cutoff);
    days.iter()
        .copied()
        .filter(|&d| (d + 1) * crate::days::DAY_MS <= cutoff_ms)
        .collect()
}

async fn with_lock_retries(
    client: &mut Client,
    ddl: Ddl,
    lock_timeout: Duration,
) -> Result<DdlOutcome, RetentionError> {
    for attempt in 1..=DDL_ATTEMPTS {
        let result = match ddl {
            Ddl::Create(day) => create_once(client, day, lock_timeout).await,
            Ddl::Drop { day, cutoff } => drop_once(client, day, cutoff, lock_timeout).await,
        };
        match result {
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                tracing::debug!(
                    ?ddl,
                    attempt,
                    "partition DDL timed out waiting for its lock"
                );
                tokio::time::sleep(lock_timeout * attempt).await;
            }
            other => return Ok(DdlOutcome::Done(other?)),
        }
    }
    tracing::warn!(
        ?ddl,
        "partition DDL postponed: its lock was busy on every attempt"
    );
    Ok(DdlOutcome::Postponed)
}

async fn begin_ddl<'a>(
    client: &'a mut Client,
    lock_timeout: Duration,
) -> Result<deadpool_postgres::Transaction<'a>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PARTITION_LOCK])
        .await?;
    let ms = lock_timeout.as_millis().max(1);
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{ms}ms'"))
        .await?;
    Ok(tx)
}

async fn create_once(
    client: &mut Client,
    day: i64,
    lock_timeout: Duration,
) -> Result<u64, tokio_postgres::Error> {
    let tx = begin_ddl(client, lock_timeout).await?;
    let name = partition_name(day);
    let exists = tx
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
        .await?
        .get::<_, bool>(0);
    if exists {
        return Ok(0);
    }
    let (from, to) = day_bounds(day);
    // Created detached, filled from the default partition, then attached: ATTACH needs only a
    // SHARE UPDATE EXCLUSIVE lock on the inbox, and the CHECK spares it a scan of the new table.
    tx.batch_execute(&format!(
        "CREATE TABLE {name} (LIKE inbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
         ALTER TABLE {name} ADD CONSTRAINT {name}_range
             CHECK (message_id >= '{from}' AND message_id < '{to}');"
    ))
    .await?;
    let moved = tx
        .execute(
            &format!(
                "WITH moved AS (DELETE FROM {DEFAULT_PARTITION}
                                WHERE message_id >= $1 AND message_id < $2 RETURNING *)
                 INSERT INTO {name} SELECT * FROM moved"
            ),
            &[&from, &to],
        )
        .await?;
    tx.batch_execute(&format!(
        "ALTER TABLE inbox ATTACH PARTITION {name} FOR VALUES FROM ('{from}') TO ('{to}');
         ALTER TABLE {name} DROP CONSTRAINT {name}_range;"
    ))
    .await?;
    tx.commit().await?;
    Ok(moved)
}

async fn drop_once(
    client: &mut Client,
    day: i64,
    cutoff: SystemTime,
    lock_timeout: Duration,
) -> Result<u64, tokio_postgres::Error> {
    let tx = begin_ddl(client, lock_timeout).await?;
    let name = partition_name(day);
    let exists = tx
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
        .await?
        .get::<_, bool>(0);
    if !exists {
        return Ok(0);
    }
    tx.batch_execute(&format!("ALTER TABLE inbox DETACH PARTITION {name}"))
        .await?;
    // The day's range is no longer covered: these rows now route to the default partition.
    let kept = tx
        .execute(
            &format!(
                "INSERT INTO inbox SELECT * FROM {name}
                 WHERE processed_at >= $1 AND get_byte(uuid_send(message_id), 6) >> 4 <> 7"
            ),
            &[&cutoff],
        )
        .await?;
    tx.batch_execute(&format!("DROP TABLE {name}")).await?;
    tx.commit().await?;
    Ok(kept)
}

/// The planner's estimate of a table's rows (exact after VACUUM or ANALYZE; 0 when never
/// analyzed), read without scanning it.
pub(crate) async fn estimated_rows(client: &Client, table: &str) -> Result<i64, RetentionError> {
    let row = client
        .query_one(
            "SELECT coalesce(greatest(reltuples, 0), 0)::bigint FROM pg_class
             WHERE oid = to_regclass($1)",
            &[&table],
        )
        .await?;
    Ok(row.get(0))
}

/// Rows in the default partition, counted up to `limit` (an exact count below it).
pub(crate) async fn default_rows(client: &Client, limit: i64) -> Result<i64, RetentionError> {
    let row = client
        .query_one(
            &format!("SELECT count(*) FROM (SELECT 1 FROM {DEFAULT_PARTITION} LIMIT $1) t"),
            &[&limit],
        )
        .await?;
    Ok(row.get(0))
}

/// Refuses more days ahead than [`defaults::MAX_PARTITIONS_AHEAD`] ([`RetentionError::TooFarAhead`]).
pub(crate) fn check_ahead(ahead: u32) -> Result<(), RetentionError> {
    let max = defaults::MAX_PARTITIONS_AHEAD;
    match ahead <= max {
        true => Ok(()),
        false => Err(RetentionError::TooFarAhead { given: ahead, max }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn a_day_expires_once_its_last_millisecond_is_older_than_the_cutoff() {
        let day_ms = crate::days::DAY_MS as u64;
        let cutoff = UNIX_EPOCH + Duration::from_millis(10 * day_ms);
        assert_eq!(expired_days(&[7, 8, 9, 10, 11], cutoff), vec![7, 8, 9]);
        let cutoff = UNIX_EPOCH + Duration::from_millis(10 * day_ms - 1);
        assert_eq!(expired_days(&[8, 9, 10], cutoff), vec![8]);
    }

    #[test]
    fn more_partitions_ahead_than_a_year_and_a_day_are_refused() {
        assert!(check_ahead(0).is_ok());
        assert!(check_ahead(defaults::MAX_PARTITIONS_AHEAD).is_ok());
        let e = check_ahead(defaults::MAX_PARTITIONS_AHEAD + 1).unwrap_err();
        assert_eq!(e.to_string(), "367 partitions ahead: at most 366");
        assert!(!e.is_retryable());
    }
}

//! Inbox retention: expired rows leave the inbox without ever stalling the processor.
//!
//! - Plain inbox: rows processed before `now - retention` are deleted in small batches
//!   (`delete`).
//! - Partitioned inbox (`partition`): daily partitions by UUIDv7 time are prepared ahead and
//!   dropped whole once every id in them is older than the retention; the default partition
//!   (UUIDv4 ids, ids outside the prepared days) is cleaned like a plain inbox.
//!
//! Invariant: a row is removed only when `processed_at` (row deletes) or its id's UUIDv7 time
//! (partition drops) is older than the retention. A copy of a removed UUIDv7 id is then older
//! than the window too, and the dedup-window guard (`pipeline::message::reject_outside_window`)
//! dead-letters it instead of applying it again. UUIDv4 ids carry no time: their dedup window is
//! the retention of their row, counted from when it was processed.

use crate::days;
pub(crate) mod delete;
pub(crate) mod partition;
mod settings;
pub mod topic;

use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::{Pool, PoolError};
use tokio_util::sync::CancellationToken;

pub use partition::{convert, Conversion, Layout};
pub use settings::RetentionSettings;

use crate::fault::is_retryable_db;
use partition::{DdlOutcome, DEFAULT_PARTITION};

/// Failure of a retention step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetentionError {
    /// No connection could be had from the pool.
    #[error("database pool: {}", crate::one_line::pool_line(.0))]
    Pool(#[from] PoolError),
    /// A statement failed.
    #[error("database: {}", crate::one_line::pg_line(.0))]
    Db(#[from] tokio_postgres::Error),
    /// There is no inbox table yet.
    #[error("there is no inbox table: run `batch-inbox migrate`")]
    NoInbox,
    /// The conversion to the partitioned layout did not copy every row; it was rolled back.
    #[error("conversion copied {rows} rows of {expected}; rolled back")]
    CopyMismatch {
        /// Rows in the plain inbox.
        expected: i64,
        /// Rows copied.
        rows: u64,
    },
    /// More partitions ahead than 366 (a year and a day; `MAX_PARTITIONS_AHEAD`):
    /// each is a table, and days past the year 9999 have no partition name.
    #[error("{given} partitions ahead: at most {max}")]
    TooFarAhead {
        /// The days ahead asked for.
        given: u32,
        /// The most there may be.
        max: u32,
    },
}

impl RetentionError {
    /// Whether the next run may succeed (a lost connection, a lock that timed out).
    pub fn is_retryable(&self) -> bool {
        match self {
            RetentionError::Db(e) => is_retryable_db(e),
            RetentionError::Pool(_) => true,
            RetentionError::NoInbox
            | RetentionError::CopyMismatch { .. }
            | RetentionError::TooFarAhead { .. } => false,
        }
    }
}

/// What one cleanup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupReport {
    /// The inbox's layout.
    pub layout: Layout,
    /// Rows older than this were expired.
    pub cutoff: SystemTime,
    /// Rows deleted one batch at a time (the plain inbox, or the default partition).
    pub rows_deleted: u64,
    /// DELETE statements run.
    pub delete_statements: u64,
    /// The longest DELETE statement.
    pub longest_statement: Duration,
    /// Partitions created ahead.
    pub partitions_created: Vec<String>,
    /// Expired partitions dropped.
    pub partitions_dropped: Vec<String>,
    /// Rows in the dropped partitions, as estimated by the planner statistics (not counted: a
    /// count would read the whole partition).
    pub rows_dropped_estimate: i64,
    /// Rows of dropped partitions that were not expired (UUIDv4), kept in the default partition.
    pub rows_kept_from_dropped: u64,
    /// Partition DDL that found its lock busy on every attempt, left for the next run.
    pub postponed: Vec<String>,
    /// Rows in the default partition afterwards, counted up to [`DEFAULT_COUNT_LIMIT`].
    pub default_rows: Option<i64>,
    /// Time taken.
    pub elapsed: Duration,
}

/// The default partition is counted up to this many rows.
pub const DEFAULT_COUNT_LIMIT: i64 = 1_000_000;

impl std::fmt::Display for CleanupReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "removed {} rows in {} statements (longest {:.1} ms)",
            self.rows_deleted,
            self.delete_statements,
            self.longest_statement.as_secs_f64() * 1e3
        )?;
        if self.layout == Layout::Partitioned {
            write!(
                f,
                ", dropped {} partitions {:?} (about {} rows; kept {} unexpired UUIDv4 rows), \
                 created {:?}",
                self.partitions_dropped.len(),
                self.partitions_dropped,
                self.rows_dropped_estimate,
                self.rows_kept_from_dropped,
                self.partitions_created
            )?;
            match self.default_rows {
                Some(n) if n >= DEFAULT_COUNT_LIMIT => write!(f, ", default partition ≥ {n} rows")?,
                Some(n) => write!(f, ", default partition {n} rows")?,
                None => {}
            }
            if !self.postponed.is_empty() {
                write!(f, ", postponed (lock busy) {:?}", self.postponed)?;
            }
        }
        write!(f, " in {:.2} s", self.elapsed.as_secs_f64())
    }
}

/// Prepares partitions from today to `ahead` days after it (partitioned layout; nothing for a
/// plain inbox). Returns the partitions created and those postponed.
pub async fn prepare_partitions(
    pool: &Pool,
    settings: &RetentionSettings,
    now: SystemTime,
) -> Result<(Vec<String>, Vec<String>), RetentionError> {
    partition::check_ahead(settings.partitions_ahead)?;
    let mut client = pool.get().await?;
    if partition::layout(&client).await? == Layout::Plain {
        return Ok((Vec::new(), Vec::new()));
    }
    let today = days::day_of_millis(days::unix_millis(now));
    let existing = partition::partition_days(&client).await?;
    let (mut created, mut postponed) = (Vec::new(), Vec::new());
    for day in today..=today + i64::from(settings.partitions_ahead) {
        if existing.contains(&day) {
            continue;
        }
        match partition::create_day(&mut client, day, settings.lock_timeout).await? {
            DdlOutcome::Done(_) => created.push(days::partition_name(day)),
            DdlOutcome::Postponed => postponed.push(days::partition_name(day)),
        }
    }
    Ok((created, postponed))
}

/// One cleanup at time `now`: prepares partitions ahead, drops expired ones, and deletes expired
/// rows in batches, until done or `stop` is cancelled.
pub async fn cleanup(
    pool: &Pool,
    settings: &RetentionSettings,
    now: SystemTime,
    stop: &CancellationToken,
) -> Result<CleanupReport, RetentionError> {
    let started = Instant::now();
    let cutoff = days::before(now, settings.retention);
    let (partitions_created, mut postponed) = prepare_partitions(pool, settings, now).await?;
    let mut client = pool.get().await?;
    let layout = partition::layout(&client).await?;
    let mut report = CleanupReport {
        layout,
        cutoff,
        rows_deleted: 0,
        delete_statements: 0,
        longest_statement: Duration::ZERO,
        partitions_created,
        partitions_dropped: Vec::new(),
        rows_dropped_estimate: 0,
        rows_kept_from_dropped: 0,
        postponed: Vec::new(),
        default_rows: None,
        elapsed: Duration::ZERO,
    };
    let table = match layout {
        Layout::Plain => "inbox",
        Layout::Partitioned => DEFAULT_PARTITION,
    };
    if layout == Layout::Partitioned {
        drop_expired(&mut client, settings, cutoff, &mut report, &mut postponed).await?;
    }
    let (batch, pause) = (settings.batch_rows, settings.pause);
    let deleted = delete::delete_expired(&client, table, cutoff, batch, pause, stop).await?;
    report.rows_deleted = deleted.rows;
    report.delete_statements = deleted.statements;
    report.longest_statement = deleted.longest;
    if layout == Layout::Partitioned {
        report.default_rows = Some(partition::default_rows(&client, DEFAULT_COUNT_LIMIT).await?);
    }
    report.postponed = postponed;
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Drops every partition whose day is older than `cutoff`, adding to `report`.
async fn drop_expired(
    client: &mut deadpool_postgres::Client,
    settings: &RetentionSettings,
    cutoff: SystemTime,
    report: &mut CleanupReport,
    postponed: &mut Vec<String>,
) -> Result<(), RetentionError> {
    let existing = partition::partition_days(client).await?;
    for day in partition::expired_days(&existing, cutoff) {
        let name = days::partition_name(day);
        let estimate = partition::estimated_rows(client, &name).await?;
        match partition::drop_day(client, day, cutoff, settings.lock_timeout).await? {
            DdlOutcome::Done(kept) => {
                report.rows_dropped_estimate += estimate;
                report.rows_kept_from_dropped += kept;
                report.partitions_dropped.push(name);
            }
            DdlOutcome::Postponed => postponed.push(name),
        }
    }
    Ok(())
}

/// The background maintenance of `run`: every `interval` until `stop` is cancelled, prepares
/// partitions ahead (partitioned layout) and, when `expire` is set, runs a cleanup. Failures are
/// logged and retried at the next interval; they never stop the processor.
pub async fn maintain(
    pool: Pool,
    settings: RetentionSettings,
    expire: bool,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        let now = SystemTime::now();
        let outcome = if expire {
            cleanup(&pool, &settings, now, &stop)
                .await
                .map(|r| tracing::info!("retention: {r}"))
        } else {
            prepare_partitions(&pool, &settings, now)
                .await
                .map(|(created, postponed)| {
                    if !created.is_empty() || !postponed.is_empty() {
                        tracing::info!(?created, ?postponed, "inbox partitions prepared");
                    }
                })
        };
        if let Err(e) = outcome {
            tracing::warn!(retryable = e.is_retryable(), "retention: {e}");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

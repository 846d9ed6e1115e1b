//! The retention's typed settings: how old a row may get, and how gently it is removed (the
//! flags that set them are in module `config`).

use std::time::Duration;

/// How the cleanup removes expired inbox rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionSettings {
    /// Rows older than this (by `processed_at`, or by the UUIDv7 day of a partition) expire.
    pub retention: Duration,
    /// Most rows one DELETE statement removes (each statement is its own short transaction).
    pub batch_rows: i64,
    /// Pause between two DELETE statements, so the processor's transactions run in between.
    pub pause: Duration,
    /// `lock_timeout` of partition DDL: a create or drop that would wait longer for its lock gives
    /// up (and is retried) instead of queueing the processor's inserts behind it.
    pub lock_timeout: Duration,
    /// Daily partitions prepared ahead of today (partitioned layout).
    pub partitions_ahead: u32,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        use crate::pipeline::defaults;
        Self {
            retention: defaults::RETENTION,
            batch_rows: defaults::CLEANUP_BATCH_ROWS,
            pause: Duration::from_millis(defaults::CLEANUP_PAUSE_MS),
            lock_timeout: Duration::from_millis(defaults::LOCK_TIMEOUT_MS),
            partitions_ahead: defaults::PARTITIONS_AHEAD,
        }
    }
}

//! The database's position of a partition, while its worker runs (offsets in the database).
//!
//! Invariant: the database is the system of record, positions included. Every offset write is a
//! compare-and-set against the position this member last committed ([`crate::db::sql::UPSERT_OFFSET`]),
//! so a database that went back in time under a running worker (a failover to a replica that
//! lagged, a restore while connections reconnect) or a position another member moved is noticed
//! by the next write, whatever the batch holds; the batch rolls back, the partition moves to the
//! database's position (one WARN line, counted), and the records from there are read again, the
//! inbox skipping what the database still holds. An idle partition, which writes nothing, compares
//! the database's position with its own every [`CHECK_EVERY`], and within [`RECONNECT_POLL`]
//! of the process opening a new connection to the database (a restart, a failover: the moment
//! the database may have gone back). At the end of a partition, the
//! position stored (in the database and for Kafka) is the source's, past a transaction's control
//! records, so a transactional topic drains.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{OffsetSink, PartitionWorker};
use crate::error::{InboxError, RunError};
use crate::pipeline::handler::Handler;

/// How often a worker compares the database's position of its partition with its own.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);

/// How often a worker looks whether the process opened a new connection to the database
/// (an atomic load; the database is read only when it did).
pub(crate) const RECONNECT_POLL: Duration = Duration::from_secs(1);

/// The timer of [`PartitionWorker::check_position`]; its first tick is one poll away.
pub(super) fn check_interval() -> Interval {
    let mut every = tokio::time::interval_at(Instant::now() + RECONNECT_POLL, RECONNECT_POLL);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    every
}

/// When an idle partition's position is compared with the database's: since the last
/// comparison, the process opened a connection (`opened` differs from `seen`: it reconnected),
/// or [`CHECK_EVERY`] passed.
pub(super) fn check_due(opened: u64, seen: u64, since_last: Duration) -> bool {
    opened != seen || since_last >= CHECK_EVERY
}

/// When a worker last compared its position with the database's.
#[derive(Debug, Clone, Copy)]
pub(super) struct Checked {
    /// The instant.
    pub(super) at: Instant,
    /// [`crate::db::connections_opened`] then.
    pub(super) connections: u64,
}

impl Checked {
    /// Now: a worker starts at the position it just read.
    pub(super) fn now() -> Self {
        Self {
            at: Instant::now(),
            connections: crate::db::connections_opened(),
        }
    }
}

impl<H: Handler, S: OffsetSink + ?Sized> PartitionWorker<H, S> {
    /// [`PartitionWorker::drain_ready`], moving the partition to the database's position when a
    /// batch found it moved ([`RunError::PositionMoved`]).
    pub(super) async fn drain_or_rewind(
        &mut self,
        stop: &CancellationToken,
        stopping: bool,
    ) -> Result<bool, RunError> {
        match self.drain_ready(stop, stopping).await {
            Err(RunError::PositionMoved { expected, .. }) => {
                self.rewind(expected, stop).await?;
                Ok(true)
            }
            other => other,
        }
    }

    /// When due ([`check_due`]), compares the database's position with this member's; moves to
    /// the database's when they differ. A failed read is retried at the next check.
    pub(super) async fn check_position(
        &mut self,
        stop: &CancellationToken,
    ) -> Result<(), RunError> {
        let opened = crate::db::connections_opened();
        if !check_due(opened, self.checked.connections, self.checked.at.elapsed()) {
            return Ok(());
        }
        self.checked = Checked {
            at: Instant::now(),
            connections: opened,
        };
        let (topic, partition) = (&*self.topic, self.partition);
        let Some(held) = self.inbox.position(topic, partition) else {
            return Ok(());
        };
        match self.inbox.stored_position(topic, partition).await {
            Ok(stored) if stored == Some(held) => Ok(()),
            Ok(_) => self.rewind(Some(held), stop).await,
            Err(e) => {
                tracing::debug!(
                    topic,
                    partition,
                    "cannot read the partition's position: {e}"
                );
                Ok(())
            }
        }
    }

    /// Moves the partition to the position the database holds, having held `expected`: reads
    /// it (retried while the database fails), seeks the source there, and starts over from it.
    async fn rewind(
        &mut self,
        expected: Option<i64>,
        stop: &CancellationToken,
    ) -> Result<(), RunError> {
        let (topic, partition) = (self.topic.clone(), self.partition);
        let mut failures = 0;
        let stored = loop {
            match self.inbox.stored_position(&topic, partition).await {
                Ok(stored) => break stored,
                Err(e) => {
                    failures += 1;
                    let delay = self.settings.retry.delay(failures);
                    tracing::warn!(
                        topic = %topic, partition,
                        "cannot read the partition's position in the database, will retry: {e}"
                    );
                    if !self.pause(delay, stop, false).await {
                        // Stopping: nothing read since is committed; the next owner starts from
                        // the database's position.
                        self.batcher.clear();
                        return Ok(());
                    }
                }
            }
        };
        let moved = RunError::PositionMoved {
            topic: topic.to_string(),
            partition,
            expected,
            stored,
        };
        if let Err(e) = self.sink.rewind(&topic, partition, stored) {
            tracing::error!(topic = %topic, partition, "cannot move the partition: {e}");
            return Err(moved);
        }
        let behind = match (expected, stored) {
            (Some(e), Some(s)) => e.saturating_sub(s).max(0),
            (Some(e), None) => e.max(0),
            (None, _) => 0,
        };
        if behind > 0 || stored.is_none() {
            self.stats.record_rewind(behind as u64);
            tracing::warn!(
                topic = %topic, partition,
                database = stored, member = expected, behind,
                "{moved}: reading again from the database's position; the inbox skips what it holds"
            );
        } else {
            // Ahead: a commit whose answer was lost (it committed), or another member applied
            // the partition meanwhile. Nothing is lost; the records up to there are skipped.
            tracing::info!(
                topic = %topic, partition, database = stored, member = expected,
                "the database holds a position ahead of this member's (a commit whose answer was \
                 lost, or another member's): going on from it"
            );
        }
        self.batcher.clear();
        self.pending = None;
        self.sequence = super::Sequence::default();
        self.tracker = crate::pipeline::offsets::OffsetTracker::default();
        self.went_back = None;
        self.rewound = true;
        self.at_eof.store(false, Ordering::Release);
        self.inbox.hold_position(&topic, partition, stored);
        Ok(())
    }

    /// At the end of the partition, with every record read committed: stores the source's
    /// position when it is past the last record committed (control records of a transactional
    /// producer, aborted records), in the database first. Returns false when abandoned.
    pub(super) async fn past_markers(
        &mut self,
        stop: &CancellationToken,
    ) -> Result<bool, RunError> {
        let (topic, partition) = (self.topic.clone(), self.partition);
        let Some(position) = self.sink.position(&topic, partition) else {
            return Ok(true);
        };
        let held = self.inbox.position(&topic, partition);
        let in_db = self.inbox.offsets_group().is_some();
        if in_db && held.is_some_and(|h| position <= h) {
            return Ok(true);
        }
        if in_db {
            let inbox = self.inbox.clone();
            let mut failures = 0;
            loop {
                match inbox.advance_position(&topic, partition, position).await {
                    Ok(()) => break,
                    Err(InboxError::PositionMoved { expected }) => {
                        self.rewind(expected, stop).await?;
                        return Ok(true);
                    }
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(
                            topic = %topic, partition, position,
                            "cannot store the partition's end position, will retry: {e}"
                        );
                        let delay = self.settings.retry.delay(failures);
                        if !self.pause(delay, stop, false).await {
                            return Ok(false);
                        }
                    }
                }
            }
        }
        self.store_offset(Some(position - 1));
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_partition_is_checked_after_a_reconnection_or_a_period() {
        assert!(!check_due(4, 4, Duration::ZERO));
        assert!(!check_due(4, 4, CHECK_EVERY - Duration::from_millis(1)));
        assert!(check_due(4, 4, CHECK_EVERY));
        // A connection opened since the last check: at once.
        assert!(check_due(5, 4, Duration::ZERO));
    }
}

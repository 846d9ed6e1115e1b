//! Offset continuity of one partition worker's records.
//!
//! Invariant: every record after the first whose offset is not the previous record's + 1 is
//! counted once in `Stats::offset_gaps` and logged. Such a gap is legitimate in Kafka after
//! compaction or transaction markers, never with this project's producer: it means records the
//! source (broker or client) skipped.

use std::sync::atomic::Ordering;

use crate::stats::Stats;

/// The offset the next record should have (none before the first record).
#[derive(Debug, Default)]
pub(super) struct Sequence {
    expected: Option<i64>,
}

impl Sequence {
    /// Checks `offset` against the previous record's: logs the first offset of the assignment,
    /// counts and logs a gap.
    pub(super) fn observe(&mut self, topic: &str, partition: i32, offset: i64, stats: &Stats) {
        match self.expected {
            None => tracing::info!(topic, partition, offset, "first record of the assignment"),
            Some(expected) if expected != offset => {
                stats.offset_gaps.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    topic,
                    partition,
                    expected,
                    received = offset,
                    "offset gap: the source skipped records"
                );
            }
            Some(_) => {}
        }
        self.expected = Some(offset.saturating_add(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_skips_and_repeats_but_not_the_first_record() {
        let stats = Stats::default();
        let mut s = Sequence::default();
        for o in [10, 11, 13, 14, 14, 15, i64::MAX, i64::MAX] {
            s.observe("t", 0, o, &stats);
        }
        assert_eq!(stats.offset_gaps.load(Ordering::Relaxed), 3);
    }
}

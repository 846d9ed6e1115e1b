//! Offset continuity of one partition worker's records.
//!
//! Invariant: every record after the first whose offset is not the previous record's + 1 is
//! counted once in `Stats::offset_gaps` and logged. Such a gap is legitimate in Kafka after
//! compaction or transaction markers, never with this project's producer: it means records the
//! source (broker or client) skipped. An offset *below* the expected one is another matter: the
//! client reset its position to the start of a log that is not the one it was reading (the topic
//! was deleted and re-created, or the log was truncated): [`Continuity::Back`], which the worker
//! refuses to apply.

use std::sync::atomic::Ordering;

use crate::observe::stats::Stats;

/// The offset the next record should have (none before the first record).
#[derive(Debug, Default)]
pub(super) struct Sequence {
    expected: Option<i64>,
}

/// How a record's offset follows the previous one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Continuity {
    /// The next one, the first one, or after a gap (logged and counted).
    Forward,
    /// Below the offset expected: the position went back to the start of another log.
    Back {
        /// The offset expected.
        expected: i64,
    },
}

impl Sequence {
    /// Checks `offset` against the previous record's: logs the first offset of the assignment,
    /// counts and logs a gap; says when it went back (the expectation is then unchanged).
    pub(super) fn observe(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        stats: &Stats,
    ) -> Continuity {
        match self.expected {
            None => tracing::info!(topic, partition, offset, "first record of the assignment"),
            Some(expected) if offset < expected => {
                stats.offset_gaps.fetch_add(1, Ordering::Relaxed);
                return Continuity::Back { expected };
            }
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
        Continuity::Forward
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_skips_and_repeats_but_not_the_first_record() {
        let stats = Stats::default();
        let mut s = Sequence::default();
        let seen: Vec<Continuity> = [10, 11, 13, 14, 14, 15, 3, 16, i64::MAX, i64::MAX]
            .iter()
            .map(|&o| s.observe("t", 0, o, &stats))
            .collect();
        assert_eq!(stats.offset_gaps.load(Ordering::Relaxed), 4);
        let back: Vec<(usize, Continuity)> = seen
            .into_iter()
            .enumerate()
            .filter(|(_, c)| *c != Continuity::Forward)
            .collect();
        assert_eq!(
            back,
            [
                (4, Continuity::Back { expected: 15 }),
                (6, Continuity::Back { expected: 16 }),
            ],
            "a repeat and a reset go back; the expectation stays"
        );
    }
}

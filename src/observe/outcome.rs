//! What one committed transaction did and how long it took: the value a partition worker hands,
//! once per COMMIT, to the processor's one observer ([`crate::observe::stats::Stats::record_batch`]).

use std::time::{Duration, Instant};

use crate::reason::ReasonCounts;

/// What one transaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxOutcome {
    /// Records in the transaction.
    pub received: u64,
    /// Ids that were new and went to the handler (applied or rejected).
    pub new: u64,
    /// Records skipped as duplicates (inside the batch or already in the inbox).
    pub duplicates: u64,
    /// New messages the handler rejected.
    pub rejected: u64,
    /// New messages the handler failed on alone (poison), dead-lettered without being applied.
    pub poisoned: u64,
    /// Records that could not be decoded.
    pub invalid: u64,
    /// Dead-letter rows written (fewer than rejected + invalid on redelivery).
    pub dead_letters_written: u64,
    /// Dead-lettered records (rejected + invalid), by reason.
    pub dead_letter_reasons: ReasonCounts,
    /// Time in each step.
    pub timings: StageTimings,
}

/// Time spent in each step of one transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTimings {
    /// The inbox insert (dedup statement).
    pub dedup: Duration,
    /// The handler.
    pub handler: Duration,
    /// The dead-letter insert.
    pub dead_letters: Duration,
    /// The COMMIT.
    pub commit: Duration,
}

impl std::ops::AddAssign for StageTimings {
    fn add_assign(&mut self, o: Self) {
        self.dedup += o.dedup;
        self.handler += o.handler;
        self.dead_letters += o.dead_letters;
        self.commit += o.commit;
    }
}

/// Stage names, in pipeline order.
pub(crate) const STAGES: [&str; 6] = [
    "batch_wait",
    "dedup",
    "handler",
    "dead_letters",
    "commit",
    "offset_store",
];

/// What one committed batch contributes.
#[derive(Debug, Clone, Copy)]
pub struct BatchSample<'a> {
    /// When the batch's first record arrived.
    pub opened: Instant,
    /// When the batch was closed and handed to the inbox.
    pub closed: Instant,
    /// Time in each step of its transaction(s).
    pub timings: StageTimings,
    /// Time to store its offsets.
    pub offset_store: Duration,
    /// Kafka timestamps (ms since the epoch) of its records.
    pub timestamps_ms: &'a [Option<i64>],
}

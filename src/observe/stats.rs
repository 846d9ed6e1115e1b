//! The processor's one observer: every committed transaction is reported here once
//! ([`Stats::record_batch`]), and everything that tells about a run reads from it: the counters
//! (the summary log line, the run's totals), the Prometheus metrics ([`crate::observe::telemetry`]), and,
//! only when asked for ([`Stats::with_report`]), the latency distributions of the stats file.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::SystemTime;

use crate::observe::metrics::Measured;
use crate::observe::outcome::{BatchSample, TxOutcome};

/// Counters since the processor started. Updated after each COMMIT; read them with
/// [`Stats::snapshot`].
#[derive(Debug, Default)]
pub struct Stats {
    /// Records in committed transactions.
    pub(crate) records: AtomicU64,
    /// New ids handed to the handler.
    pub(crate) new: AtomicU64,
    /// Records skipped as duplicates.
    pub(crate) duplicates: AtomicU64,
    /// New messages the handler rejected.
    pub(crate) rejected: AtomicU64,
    /// Records that could not be decoded.
    pub(crate) invalid: AtomicU64,
    /// Dead-letter rows written.
    pub(crate) dead_letters_written: AtomicU64,
    /// Committed transactions.
    pub(crate) transactions: AtomicU64,
    /// Attempts that failed and were retried.
    pub(crate) retries: AtomicU64,
    /// New messages dead-lettered as poison (the handler failed on them alone).
    pub(crate) poisoned: AtomicU64,
    /// Transactions that failed for a non-transient handler error and led to bisecting a batch.
    pub(crate) poison_failures: AtomicU64,
    /// Records not read again on assignment because the offset stored in the database was
    /// ahead of Kafka's committed one (replay avoided by offsets in the database).
    pub(crate) replays_avoided: AtomicU64,
    /// Offsets the client refused to store (the partition was no longer assigned).
    pub(crate) offsets_refused: AtomicU64,
    /// Times a partition started from, or was moved back to, a database position behind the
    /// one Kafka or this member had (the database went back in time: a restore, a failover).
    pub(crate) positions_rewound: AtomicU64,
    /// Records between the database's position and Kafka's or this member's, re-read at those
    /// rewinds (the gap the database lost; the inbox skips what it still holds).
    pub(crate) records_rewound: AtomicU64,
    /// Partitions revoked from this member, counted as each revoke arrives, before it waits for
    /// their in-flight batches (a live counter, not in the snapshot:
    /// [`Stats::partitions_revoked`]).
    pub(crate) partitions_revoked: AtomicU64,
    /// Records whose offset was not the previous record's offset + 1 within one partition
    /// worker (a gap: records the source skipped; never expected with this project's producer).
    pub(crate) offset_gaps: AtomicU64,
    /// Latency and batch-size distributions for `--stats-file`; only kept when asked for.
    report: Option<crate::observe::metrics::Metrics>,
    /// Prometheus metrics and live gauges (lag, in-flight batches, assigned partitions).
    pub(crate) telemetry: crate::observe::telemetry::Telemetry,
    /// Kafka unreachable: its connection errors, said in a few lines.
    pub(crate) kafka_outage: crate::observe::telemetry::outage::OutageLog,
}

/// A copy of [`Stats`] at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Records in committed transactions.
    pub records: u64,
    /// New ids handed to the handler.
    pub new: u64,
    /// Records skipped as duplicates.
    pub duplicates: u64,
    /// New messages the handler rejected.
    pub rejected: u64,
    /// Records that could not be decoded.
    pub invalid: u64,
    /// Dead-letter rows written.
    pub dead_letters_written: u64,
    /// Committed transactions.
    pub transactions: u64,
    /// Attempts that failed and were retried.
    pub retries: u64,
    /// New messages dead-lettered as poison.
    #[serde(default)]
    pub poisoned: u64,
    /// Transactions that failed for a non-transient handler error.
    #[serde(default)]
    pub poison_failures: u64,
    /// Records not read again thanks to offsets in the database.
    #[serde(default)]
    pub replays_avoided: u64,
    /// Offsets the client refused to store (partition no longer assigned).
    #[serde(default)]
    pub offsets_refused: u64,
    /// Offset gaps seen by partition workers.
    #[serde(default)]
    pub offset_gaps: u64,
    /// Times a partition went back to the database's position (the database went back in
    /// time).
    #[serde(default)]
    pub positions_rewound: u64,
    /// Records re-read at those rewinds: the gap between the database's position and Kafka's
    /// or this member's.
    #[serde(default)]
    pub records_rewound: u64,
}

impl Stats {
    /// Stats that also keep the latency and batch-size distributions of the run (its report).
    pub fn with_report() -> Self {
        Self {
            report: Some(crate::observe::metrics::Metrics::default()),
            ..Self::default()
        }
    }

    /// Records one committed transaction, `committed_at` being the wall-clock time of its COMMIT:
    /// the counters, the Prometheus metrics and, when kept, the report's distributions.
    pub(crate) fn record_batch(
        &self,
        o: &TxOutcome,
        sample: &BatchSample<'_>,
        committed_at: SystemTime,
    ) {
        self.count(o);
        self.telemetry.record_batch(o, sample, committed_at);
        if let Some(report) = &self.report {
            report.record_batch(sample, committed_at);
        }
    }

    /// Records the arrivals of a batch that just closed at `closed_ms` (Unix ms).
    pub(crate) fn record_arrivals(
        &self,
        arrivals: &[crate::observe::metrics::Arrival],
        closed_ms: i64,
    ) {
        self.telemetry.record_arrivals(arrivals, closed_ms);
        if let Some(report) = &self.report {
            report.record_arrivals(arrivals, closed_ms);
        }
    }

    /// The report's distributions so far (`None` unless made [`Stats::with_report`]).
    pub fn measured(&self) -> Option<Measured> {
        self.report
            .as_ref()
            .map(crate::observe::metrics::Metrics::measured)
    }

    /// Counts one move of a partition back to the database's position, `records` behind it.
    pub(crate) fn record_rewind(&self, records: u64) {
        self.positions_rewound.fetch_add(1, Relaxed);
        self.records_rewound.fetch_add(records, Relaxed);
        self.telemetry.record_rewind(records);
    }

    /// Counts one failed attempt that will be retried.
    pub(crate) fn record_retry(&self) {
        self.retries.fetch_add(1, Relaxed);
        self.telemetry.record_retry();
    }

    fn count(&self, o: &TxOutcome) {
        self.records.fetch_add(o.received, Relaxed);
        self.new.fetch_add(o.new, Relaxed);
        self.duplicates.fetch_add(o.duplicates, Relaxed);
        self.rejected.fetch_add(o.rejected, Relaxed);
        self.poisoned.fetch_add(o.poisoned, Relaxed);
        self.invalid.fetch_add(o.invalid, Relaxed);
        self.dead_letters_written
            .fetch_add(o.dead_letters_written, Relaxed);
        self.transactions.fetch_add(1, Relaxed);
    }

    /// Shows `controls`' unsafe switches in the metrics (`batch_inbox_unsafe_mode`) at once,
    /// before [`crate::run`] does, so that no scrape of an unsafe run reads 0.
    pub fn mark_unsafe(&self, controls: &crate::unsafe_controls::UnsafeControls) {
        self.telemetry.set_unsafe_mode(&controls.switches());
    }

    /// Total consumer lag over the partitions with a known lag (librdkafka's statistics), and
    /// how many those are.
    pub fn total_lag(&self) -> (i64, usize) {
        self.telemetry.total_lag()
    }

    /// The unsafe test-only switches that are on (none in a normal build).
    pub fn unsafe_switches(&self) -> Vec<&'static str> {
        self.telemetry.unsafe_switches()
    }

    /// Partitions assigned to this member now (one worker each).
    pub fn assigned_partitions(&self) -> i64 {
        self.telemetry.assigned_partitions()
    }

    /// Partitions revoked from this member so far, counted as each revoke arrives (before it
    /// waits for their in-flight batches).
    pub fn partitions_revoked(&self) -> u64 {
        self.partitions_revoked.load(Relaxed)
    }

    /// Why a partition is stalled (its SQLSTATE and what failed), or `None` when none is: what
    /// `/readyz` reports.
    pub fn stall_reason(&self) -> Option<String> {
        self.telemetry.stalls.reason()
    }

    /// The processor's metrics as `/metrics` serves them (the OpenMetrics text format,
    /// `application/openmetrics-text; version=1.0.0`), for a service that runs [`crate::run`]
    /// and serves them from its own HTTP server; the pool's gauges are the listener's, and stay
    /// at their last values here. With [`Stats::stall_reason`] and
    /// [`Stats::assigned_partitions`] it has what `/readyz` answers from.
    pub fn openmetrics(&self) -> String {
        self.telemetry.encode()
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            records: self.records.load(Relaxed),
            new: self.new.load(Relaxed),
            duplicates: self.duplicates.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            invalid: self.invalid.load(Relaxed),
            dead_letters_written: self.dead_letters_written.load(Relaxed),
            transactions: self.transactions.load(Relaxed),
            retries: self.retries.load(Relaxed),
            poisoned: self.poisoned.load(Relaxed),
            poison_failures: self.poison_failures.load(Relaxed),
            replays_avoided: self.replays_avoided.load(Relaxed),
            positions_rewound: self.positions_rewound.load(Relaxed),
            records_rewound: self.records_rewound.load(Relaxed),
            offsets_refused: self.offsets_refused.load(Relaxed),
            offset_gaps: self.offset_gaps.load(Relaxed),
        }
    }
}

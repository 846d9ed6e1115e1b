//! Live operational state of a processor, in Prometheus metrics: what was committed (counters),
//! how long each stage took (histograms), and what is happening now (gauges: consumer lag per
//! partition, batches in flight, assigned partitions, pool connections in use).
//!
//! Invariant: counters move only after the COMMIT of the transaction they count, by exactly the
//! figures of its [`TxOutcome`], so after a run they equal the rows it wrote. Everything is
//! recorded once per committed transaction (per batch), never per message: the end-to-end latency
//! of a batch's records goes into its histogram under one lock.

pub mod histogram;
pub mod stall;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::Arrival;
use crate::outcome::{BatchSample, TxOutcome, STAGES};
use crate::reason::Reason;
pub use histogram::BatchHistogram;

/// Labels of a per-partition series.
type PartitionLabels = [(&'static str, String); 2];
/// Labels with one key.
type OneLabel = [(&'static str, &'static str); 1];
/// The `reason` label of the dead-letter counter (handlers name their own reasons).
type ReasonLabel = [(&'static str, String); 1];

/// Metric name prefix.
pub const PREFIX: &str = "batch_inbox";

/// The processor's metrics. Cloning a metric shares it, so [`Telemetry::registry`] can be built
/// at any time from the same values the workers update.
#[derive(Debug)]
pub struct Telemetry {
    consumed: Counter,
    new: Counter,
    duplicates: Counter,
    dead_letters: Family<ReasonLabel, Counter>,
    batches: Counter,
    retries: Counter,
    batch_size: BatchHistogram,
    stages: Family<OneLabel, BatchHistogram, fn() -> BatchHistogram>,
    by_stage: Vec<BatchHistogram>,
    end_to_end: BatchHistogram,
    receive: BatchHistogram,
    in_batch: BatchHistogram,
    lag: Family<PartitionLabels, Gauge>,
    lags: Mutex<BTreeMap<(String, i32), i64>>,
    in_flight: Gauge,
    assigned: Gauge,
    pool_in_use: Gauge,
    pool_max: Gauge,
    unsafe_mode: Gauge,
    unsafe_switches: Mutex<Vec<&'static str>>,
    /// The rejection names with a series of their own (at most [`MAX_REJECTION_LABELS`]).
    rejection_labels: Mutex<std::collections::BTreeSet<String>>,
    /// Partitions waiting on the environment.
    pub stalls: stall::Stalls,
}

/// Most rejection names with a dead-letter series of their own: a handler names its reasons at
/// run time (the SQL handler's come from its statement's result), and a metric's label values
/// must stay few. Further names are counted under [`OTHER_REJECTIONS`].
pub const MAX_REJECTION_LABELS: usize = 100;

/// The `reason` label of the rejections beyond [`MAX_REJECTION_LABELS`] names (not a valid
/// rejection name, so it is never one of them).
pub const OTHER_REJECTIONS: &str = "_other";

/// Seconds, from 0.5 ms to about 65 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.0005, 2.0, 18)
}

fn latency_histogram() -> BatchHistogram {
    BatchHistogram::new(latency_buckets())
}

impl Default for Telemetry {
    fn default() -> Self {
        let dead_letters = Family::<ReasonLabel, Counter>::default();
        for r in &Reason::PIPELINE {
            drop(dead_letters.get_or_create(&[("reason", r.as_str().to_owned())]));
        }
        let stages: Family<OneLabel, BatchHistogram, fn() -> BatchHistogram> =
            Family::new_with_constructor(latency_histogram);
        let by_stage = STAGES
            .iter()
            .map(|s| stages.get_or_create(&[("stage", *s)]).clone())
            .collect();
        Self {
            consumed: Counter::default(),
            new: Counter::default(),
            duplicates: Counter::default(),
            dead_letters,
            batches: Counter::default(),
            retries: Counter::default(),
            batch_size: BatchHistogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(1.0, 2.0, 14),
            ),
            stages,
            by_stage,
            end_to_end: BatchHistogram::new(latency_buckets()),
            receive: BatchHistogram::new(latency_buckets()),
            in_batch: BatchHistogram::new(latency_buckets()),
            lag: Family::default(),
            lags: Mutex::new(BTreeMap::new()),
            in_flight: Gauge::default(),
            assigned: Gauge::default(),
            pool_in_use: Gauge::default(),
            pool_max: Gauge::default(),
            unsafe_mode: Gauge::default(),
            unsafe_switches: Mutex::new(Vec::new()),
            rejection_labels: Mutex::new(std::collections::BTreeSet::new()),
            stalls: stall::Stalls::default(),
        }
    }
}

/// Decrements a gauge when dropped.
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Telemetry {
    /// Counts one committed transaction: its outcome, its stage timings and batch size, and the
    /// end-to-end latency of its records (Kafka timestamp to `committed_at`).
    pub fn record_batch(
        &self,
        outcome: &TxOutcome,
        sample: &BatchSample<'_>,
        committed_at: SystemTime,
    ) {
        self.consumed.inc_by(outcome.received);
        self.new.inc_by(outcome.new);
        self.duplicates.inc_by(outcome.duplicates);
        for (reason, n) in outcome.dead_letter_reasons.iter() {
            self.dead_letters
                .get_or_create(&[("reason", self.reason_label(reason))])
                .inc_by(n);
        }
        self.batches.inc();
        self.batch_size.observe(outcome.received as f64);
        let t = sample.timings;
        let wait = sample.closed.saturating_duration_since(sample.opened);
        let stages = [
            wait,
            t.dedup,
            t.handler,
            t.dead_letters,
            t.commit,
            sample.offset_store,
        ];
        for (d, h) in stages.into_iter().zip(&self.by_stage) {
            h.observe(d.as_secs_f64());
        }
        let now_ms = committed_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        // Timestamps are set by producers: any i64. Saturate; a future one counts as 0 s.
        let latencies = sample.timestamps_ms.iter().flatten();
        self.end_to_end
            .observe_many(latencies.map(|ts| now_ms.saturating_sub(*ts).max(0) as f64 / 1000.0));
    }

    /// Records the arrivals of a batch that closed at `closed_ms` (Unix ms): per record, Kafka
    /// timestamp to arrival, and arrival to the batch's close.
    pub fn record_arrivals(&self, arrivals: &[Arrival], closed_ms: i64) {
        let ms = |d: i64| d.max(0) as f64 / 1000.0;
        self.receive.observe_many(
            arrivals
                .iter()
                .filter_map(|a| a.timestamp_ms.map(|ts| ms(a.at_ms.saturating_sub(ts)))),
        );
        self.in_batch.observe_many(
            arrivals
                .iter()
                .map(|a| ms(closed_ms.saturating_sub(a.at_ms))),
        );
    }

    /// Shows the dead-letter counter of each of `reasons` (a handler's rejection reasons) from
    /// the start, at 0, as the pipeline's own reasons are.
    pub fn declare_reasons(&self, reasons: &[Reason]) {
        for r in reasons {
            drop(
                self.dead_letters
                    .get_or_create(&[("reason", self.reason_label(r))]),
            );
        }
    }

    /// The `reason` label of `reason`: its name, or [`OTHER_REJECTIONS`] for a rejection name
    /// first seen after [`MAX_REJECTION_LABELS`] others.
    fn reason_label(&self, reason: &Reason) -> String {
        let Reason::Rejected(name) = reason else {
            return reason.as_str().to_owned();
        };
        let mut labels = self
            .rejection_labels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if labels.contains(name.as_str()) {
            return name.as_str().to_owned();
        }
        if labels.len() >= MAX_REJECTION_LABELS {
            return OTHER_REJECTIONS.to_owned();
        }
        labels.insert(name.as_str().to_owned());
        if labels.len() == MAX_REJECTION_LABELS {
            tracing::warn!(
                "{MAX_REJECTION_LABELS} rejection reasons have a dead-letter series: further \
                 reasons are counted under reason=\"{OTHER_REJECTIONS}\" (dead_letters rows keep \
                 their names)"
            );
        }
        name.as_str().to_owned()
    }

    /// Counts one failed attempt that will be retried.
    pub fn record_retry(&self) {
        self.retries.inc();
    }

    /// Marks a batch as in flight until the guard is dropped.
    pub fn batch_in_flight(&self) -> GaugeGuard {
        self.in_flight.inc();
        GaugeGuard(self.in_flight.clone())
    }

    /// Marks a partition as assigned (its worker running) until the guard is dropped.
    pub fn partition_assigned(&self) -> GaugeGuard {
        self.assigned.inc();
        GaugeGuard(self.assigned.clone())
    }

    /// Partitions whose workers are running.
    pub fn assigned_partitions(&self) -> i64 {
        self.assigned.get()
    }

    /// Sets the pool gauges (read when scraped).
    pub fn set_pool(&self, in_use: usize, max: usize) {
        self.pool_in_use.set(in_use as i64);
        self.pool_max.set(max as i64);
    }

    /// Records the unsafe test-only switches that are on (`batch_inbox_unsafe_mode` is 1 while
    /// any is).
    pub fn set_unsafe_mode(&self, switches: &[&'static str]) {
        self.unsafe_mode.set(i64::from(!switches.is_empty()));
        *self
            .unsafe_switches
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = switches.to_vec();
    }

    /// The unsafe test-only switches that are on, by flag name.
    pub fn unsafe_switches(&self) -> Vec<&'static str> {
        self.unsafe_switches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the consumer lag of every partition with `lags` ((topic, partition) → records
    /// not yet committed to the database). Partitions absent from `lags` lose their series.
    pub fn set_lags(&self, lags: BTreeMap<(String, i32), i64>) {
        let mut current = self.lags.lock().unwrap_or_else(|p| p.into_inner());
        for (topic, partition) in current.keys() {
            if !lags.contains_key(&(topic.clone(), *partition)) {
                self.lag.remove(&labels(topic, *partition));
            }
        }
        for ((topic, partition), lag) in &lags {
            self.lag.get_or_create(&labels(topic, *partition)).set(*lag);
        }
        *current = lags;
    }

    /// Consumer lag from librdkafka's statistics: per assigned partition, the records after
    /// the stored offset (what is committed in the database), or after the committed offset
    /// when nothing was stored yet.
    pub fn record_statistics(&self, stats: &rdkafka::Statistics) {
        let mut lags = BTreeMap::new();
        for (name, topic) in &stats.topics {
            for p in topic.partitions.values() {
                let lag = if p.consumer_lag_stored >= 0 {
                    p.consumer_lag_stored
                } else {
                    p.consumer_lag
                };
                if p.partition >= 0 && p.desired && lag >= 0 {
                    lags.insert((name.clone(), p.partition), lag);
                }
            }
        }
        self.set_lags(lags);
    }

    /// Total consumer lag over the partitions with a known lag, and how many those are.
    pub fn total_lag(&self) -> (i64, usize) {
        let lags = self.lags.lock().unwrap_or_else(|p| p.into_inner());
        (lags.values().sum(), lags.len())
    }

    /// A registry holding every metric, named with the `batch_inbox_` prefix.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix(PREFIX);
        r.register(
            "messages_consumed",
            "Records in committed transactions: applied, skipped as duplicates, or dead-lettered",
            self.consumed.clone(),
        );
        r.register(
            "messages_new",
            "Records whose id was new to the inbox (handed to the handler)",
            self.new.clone(),
        );
        r.register(
            "duplicates_skipped",
            "Records skipped because their id was already in the inbox or earlier in the batch",
            self.duplicates.clone(),
        );
        r.register(
            "dead_letters",
            "Records dead-lettered, by reason (bad input or refused by the handler)",
            self.dead_letters.clone(),
        );
        r.register(
            "batches_committed",
            "Committed transactions: one per batch (one per record in per-message mode)",
            self.batches.clone(),
        );
        r.register(
            "retries",
            "Transaction attempts that failed transiently and were retried",
            self.retries.clone(),
        );
        self.register_histograms(&mut r);
        self.register_gauges(&mut r);
        self.stalls.register(&mut r);
        r
    }

    fn register_histograms(&self, r: &mut Registry) {
        r.register(
            "batch_messages",
            "Records per committed transaction",
            self.batch_size.clone(),
        );
        r.register_with_unit(
            "stage_duration",
            "Time per batch in each stage: batch_wait (first record to close), dedup, handler, \
             dead_letters, commit, offset_store",
            Unit::Seconds,
            self.stages.clone(),
        );
        r.register_with_unit(
            "end_to_end_latency",
            "Per record: Kafka timestamp to the COMMIT of its transaction",
            Unit::Seconds,
            self.end_to_end.clone(),
        );
        r.register_with_unit(
            "receive_latency",
            "Per record: Kafka timestamp to its arrival at its partition worker (producer, broker \
             and client)",
            Unit::Seconds,
            self.receive.clone(),
        );
        r.register_with_unit(
            "in_batch_wait",
            "Per record: arrival at its partition worker to the close of its batch",
            Unit::Seconds,
            self.in_batch.clone(),
        );
    }

    fn register_gauges(&self, r: &mut Registry) {
        r.register_with_unit(
            "consumer_lag",
            "Records of an assigned partition after the last offset committed to the database \
             (librdkafka statistics)",
            Unit::Other("messages".to_owned()),
            self.lag.clone(),
        );
        r.register(
            "batches_in_flight",
            "Transactions running now",
            self.in_flight.clone(),
        );
        r.register(
            "assigned_partitions",
            "Partitions assigned to this group member (one worker each)",
            self.assigned.clone(),
        );
        r.register(
            "pool_connections_in_use",
            "Database connections checked out of the pool",
            self.pool_in_use.clone(),
        );
        r.register(
            "pool_connections_max",
            "Largest number of database connections of the pool",
            self.pool_max.clone(),
        );
        r.register(
            "unsafe_mode",
            "1 while a test-only unsafe switch is on (--unsafe-offsets-before-commit, \
             --unsafe-no-inbox): the exactly-once guarantee does not hold",
            self.unsafe_mode.clone(),
        );
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry());
        text
    }
}

fn labels(topic: &str, partition: i32) -> PartitionLabels {
    [
        ("topic", topic.to_owned()),
        ("partition", partition.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reason::ReasonCounts;
    use std::time::{Duration, Instant};

    #[test]
    fn rejection_names_beyond_the_limit_share_one_series() {
        let t = Telemetry::default();
        let names: Vec<Reason> = (0..MAX_REJECTION_LABELS + 5)
            .map(|i| Reason::Rejected(crate::reason::RejectReason::new(format!("r{i}")).unwrap()))
            .collect();
        let outcome = TxOutcome {
            dead_letter_reasons: ReasonCounts::of(&names),
            ..TxOutcome::default()
        };
        let opened = Instant::now();
        let sample = BatchSample {
            opened,
            closed: opened,
            timings: Default::default(),
            offset_store: Duration::ZERO,
            timestamps_ms: &[],
        };
        t.record_batch(&outcome, &sample, UNIX_EPOCH);
        t.record_batch(&outcome, &sample, UNIX_EPOCH);
        let text = t.encode();
        let series = text
            .lines()
            .filter(|l| l.starts_with("batch_inbox_dead_letters_total{reason=\"r"))
            .count();
        assert_eq!(series, MAX_REJECTION_LABELS, "{text}");
        assert!(
            text.contains("batch_inbox_dead_letters_total{reason=\"_other\"} 10"),
            "{text}"
        );
        assert!(text.contains("batch_inbox_dead_letters_total{reason=\"missing_id\"} 0"));
    }

    #[test]
    fn a_committed_batch_moves_each_counter_by_its_outcome() {
        let t = Telemetry::default();
        let funds = Reason::rejected("insufficient_funds");
        let reasons = ReasonCounts::of([&funds, &funds]);
        let outcome = TxOutcome {
            received: 10,
            new: 7,
            duplicates: 2,
            dead_letter_reasons: reasons,
            ..TxOutcome::default()
        };
        let opened = Instant::now();
        let sample = BatchSample {
            opened,
            closed: opened + Duration::from_millis(3),
            timings: Default::default(),
            offset_store: Duration::ZERO,
            timestamps_ms: &[Some(1_000), Some(1_500), None],
        };
        t.record_batch(&outcome, &sample, UNIX_EPOCH + Duration::from_secs(2));
        t.set_lags(BTreeMap::from([(("t".to_owned(), 3), 42)]));
        t.set_lags(BTreeMap::from([(("t".to_owned(), 4), 5)]));
        let text = t.encode();
        for line in [
            "batch_inbox_messages_consumed_total 10",
            "batch_inbox_messages_new_total 7",
            "batch_inbox_duplicates_skipped_total 2",
            "batch_inbox_dead_letters_total{reason=\"insufficient_funds\"} 2",
            "batch_inbox_dead_letters_total{reason=\"missing_id\"} 0",
            "batch_inbox_batches_committed_total 1",
            "batch_inbox_end_to_end_latency_seconds_count 2",
            "batch_inbox_end_to_end_latency_seconds_sum 1.5",
            "batch_inbox_stage_duration_seconds_count{stage=\"batch_wait\"} 1",
            "batch_inbox_consumer_lag_messages{topic=\"t\",partition=\"4\"} 5",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(
            !text.contains("partition=\"3\""),
            "a revoked partition keeps no lag series"
        );
        assert_eq!(t.total_lag(), (5, 1));
    }

    #[test]
    fn producer_set_timestamps_at_the_ends_of_i64_do_not_overflow() {
        let t = Telemetry::default();
        let opened = Instant::now();
        let sample = BatchSample {
            opened,
            closed: opened,
            timings: Default::default(),
            offset_store: Duration::ZERO,
            timestamps_ms: &[Some(i64::MAX), Some(i64::MIN)],
        };
        t.record_batch(&TxOutcome::default(), &sample, UNIX_EPOCH);
        // A timestamp in the future counts as 0 s, one at i64::MIN as i64::MAX ms.
        let sum = i64::MAX as f64 / 1000.0;
        let text = t.encode();
        assert!(
            text.contains("batch_inbox_end_to_end_latency_seconds_count 2"),
            "{text}"
        );
        assert!(text.contains(&format!("batch_inbox_end_to_end_latency_seconds_sum {sum}")));
    }
}

//! Live operational state of a processor, in Prometheus metrics: what was committed (counters),
//! how long each stage took (histograms), and what is happening now (gauges: consumer lag per
//! partition, batches in flight, assigned partitions, pool connections in use).
//!
//! Invariant: counters move only after the COMMIT of the transaction they count, by exactly the
//! figures of its [`TxOutcome`], so after a run they equal the rows it wrote. Everything is
//! recorded once per committed transaction (per batch), never per message: the end-to-end latency
//! of a batch's records goes into its histogram under one lock.

pub(crate) mod histogram;
pub(crate) mod outage;
mod registry;
pub(crate) mod stall;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::observe::metrics::Arrival;
use crate::observe::outcome::{BatchSample, TxOutcome, STAGES};
use crate::reason::Reason;
pub(crate) use histogram::BatchHistogram;

/// Labels of a per-partition series.
type PartitionLabels = [(&'static str, String); 2];
/// Labels with one key.
type OneLabel = [(&'static str, &'static str); 1];
/// The `reason` label of the dead-letter counter (handlers name their own reasons).
type ReasonLabel = [(&'static str, String); 1];

/// Metric name prefix.
pub(crate) const PREFIX: &str = "batch_inbox";

/// The processor's metrics. Cloning a metric shares it, so [`Telemetry::registry`] can be built
/// at any time from the same values the workers update.
#[derive(Debug)]
pub(crate) struct Telemetry {
    consumed: Counter,
    new: Counter,
    duplicates: Counter,
    dead_letters: Family<ReasonLabel, Counter>,
    batches: Counter,
    retries: Counter,
    positions_rewound: Counter,
    records_rewound: Counter,
    redeliveries: Counter,
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
pub(crate) const MAX_REJECTION_LABELS: usize = 100;

/// The `reason` label of the rejections beyond [`MAX_REJECTION_LABELS`] names (not a valid
/// rejection name, so it is never one of them).
pub(crate) const OTHER_REJECTIONS: &str = "_other";

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
            positions_rewound: Counter::default(),
            records_rewound: Counter::default(),
            redeliveries: Counter::default(),
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
pub(crate) struct GaugeGuard(Gauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Telemetry {
    /// Counts one committed transaction: its outcome, its stage timings and batch size, and the
    /// end-to-end latency of its records (Kafka timestamp to `committed_at`).
    pub(crate) fn record_batch(
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
    pub(crate) fn record_arrivals(&self, arrivals: &[Arrival], closed_ms: i64) {
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
    pub(crate) fn declare_reasons(&self, reasons: &[Reason]) {
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
    pub(crate) fn record_retry(&self) {
        self.retries.inc();
    }

    /// Counts one move of a partition back to the database's position, `records` behind.
    pub(crate) fn record_rewind(&self, records: u64) {
        self.positions_rewound.inc();
        self.records_rewound.inc_by(records);
    }

    /// Counts one delivery the broker marked as delivered before (RabbitMQ's `redelivered`).
    pub(crate) fn record_redelivery(&self) {
        self.redeliveries.inc();
    }

    /// Marks a batch as in flight until the guard is dropped.
    pub(crate) fn batch_in_flight(&self) -> GaugeGuard {
        self.in_flight.inc();
        GaugeGuard(self.in_flight.clone())
    }

    /// Marks a partition as assigned (its worker running) until the guard is dropped.
    pub(crate) fn partition_assigned(&self) -> GaugeGuard {
        self.assigned.inc();
        GaugeGuard(self.assigned.clone())
    }

    /// Partitions whose workers are running.
    pub(crate) fn assigned_partitions(&self) -> i64 {
        self.assigned.get()
    }

    /// Sets the pool gauges (read when scraped).
    pub(crate) fn set_pool(&self, in_use: usize, max: usize) {
        self.pool_in_use.set(in_use as i64);
        self.pool_max.set(max as i64);
    }

    /// Records the unsafe test-only switches that are on (`batch_inbox_unsafe_mode` is 1 while
    /// any is).
    pub(crate) fn set_unsafe_mode(&self, switches: &[&'static str]) {
        self.unsafe_mode.set(i64::from(!switches.is_empty()));
        *self
            .unsafe_switches
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = switches.to_vec();
    }

    /// The unsafe test-only switches that are on, by flag name.
    pub(crate) fn unsafe_switches(&self) -> Vec<&'static str> {
        self.unsafe_switches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the consumer lag of every partition with `lags` ((topic, partition) → records
    /// not yet committed to the database). Partitions absent from `lags` lose their series.
    pub(crate) fn set_lags(&self, lags: BTreeMap<(String, i32), i64>) {
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
    pub(crate) fn record_statistics(&self, stats: &rdkafka::Statistics) {
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
    pub(crate) fn total_lag(&self) -> (i64, usize) {
        let lags = self.lags.lock().unwrap_or_else(|p| p.into_inner());
        (lags.values().sum(), lags.len())
    }
}

fn labels(topic: &str, partition: i32) -> PartitionLabels {
    [
        ("topic", topic.to_owned()),
        ("partition", partition.to_string()),
    ]
}

#[cfg(test)]
mod tests;

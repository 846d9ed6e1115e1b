//! Measurements of a run for `run --stats-file`: end-to-end latency, per-stage latency, batch
//! sizes, throughput window, peak memory. Recorded once per committed transaction, reported as
//! [`StatsReport`], the file's stable format.
//!
//! End-to-end latency is measured from a record's Kafka timestamp (its intended send time, set by
//! the producer) to the COMMIT of its transaction, so a slow consumer cannot hide its queueing
//! delay (no coordinated omission).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::observe::outcome::{BatchSample, STAGES};

fn histogram() -> Histogram<u64> {
    // Microseconds, up to one hour, three significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static histogram bounds are valid")
}

/// Accumulated measurements, shared by a processor's workers.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    e2e_us: Histogram<u64>,
    receive_us: Histogram<u64>,
    in_batch_us: Histogram<u64>,
    stages_us: Vec<Histogram<u64>>,
    batch_sizes: Histogram<u64>,
    first_record: Option<Instant>,
    last_commit: Option<Instant>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                e2e_us: histogram(),
                receive_us: histogram(),
                in_batch_us: histogram(),
                stages_us: STAGES.iter().map(|_| histogram()).collect(),
                batch_sizes: histogram(),
                first_record: None,
                last_commit: None,
            }),
        }
    }
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a committed batch; `committed_at` is the wall-clock time of its COMMIT.
    pub fn record_batch(&self, sample: &BatchSample<'_>, committed_at: SystemTime) {
        let now_us = committed_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let mut m = self.lock();
        m.first_record = Some(
            m.first_record
                .map_or(sample.opened, |f| f.min(sample.opened)),
        );
        m.last_commit = Some(Instant::now());
        // Timestamps are set by producers: any i64. Saturate; a future one counts as 1 µs.
        for ts in sample.timestamps_ms.iter().flatten() {
            let us = now_us.saturating_sub(ts.saturating_mul(1000)).max(1) as u64;
            m.e2e_us.saturating_record(us);
        }
        let t = sample.timings;
        let wait = sample.closed.saturating_duration_since(sample.opened);
        for (i, d) in [
            wait,
            t.dedup,
            t.handler,
            t.dead_letters,
            t.commit,
            sample.offset_store,
        ]
        .into_iter()
        .enumerate()
        {
            m.stages_us[i].saturating_record(d.as_micros().max(1) as u64);
        }
        m.batch_sizes
            .saturating_record(sample.timestamps_ms.len().max(1) as u64);
    }

    /// Records the arrivals of a batch that just closed at `closed_ms` (Unix ms): per record,
    /// its Kafka timestamp to its arrival, and its arrival to the close.
    pub(crate) fn record_arrivals(&self, arrivals: &[Arrival], closed_ms: i64) {
        let mut m = self.lock();
        for a in arrivals {
            if let Some(ts) = a.timestamp_ms {
                let us = a.at_ms.saturating_sub(ts).saturating_mul(1000).max(1) as u64;
                m.receive_us.saturating_record(us);
            }
            let us = closed_ms
                .saturating_sub(a.at_ms)
                .saturating_mul(1000)
                .max(1) as u64;
            m.in_batch_us.saturating_record(us);
        }
    }

    /// The throughput window: first record received to last commit.
    pub(crate) fn window(&self) -> Option<Duration> {
        let m = self.lock();
        Some(m.last_commit?.saturating_duration_since(m.first_record?))
    }

    /// Summarizes everything recorded.
    pub(crate) fn measured(&self) -> Measured {
        let window = self.window().unwrap_or_default();
        let m = self.lock();
        Measured {
            window_s: window.as_secs_f64(),
            e2e_latency_ms: Percentiles::of(&m.e2e_us, 1e-3),
            receive_latency_ms: Percentiles::of(&m.receive_us, 1e-3),
            in_batch_ms: Percentiles::of(&m.in_batch_us, 1e-3),
            e2e_distribution_ms: distribution(&m.e2e_us, 1e-3),
            stages_ms: STAGES
                .iter()
                .zip(&m.stages_us)
                .map(|(name, h)| ((*name).to_owned(), Percentiles::of(h, 1e-3)))
                .collect(),
            batch_size: Percentiles::of(&m.batch_sizes, 1.0),
        }
    }
}

/// The latency and size distributions of a run, and its throughput window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Seconds from the first record received to the last commit.
    pub window_s: f64,
    /// Kafka timestamp → COMMIT, per record.
    pub e2e_latency_ms: Percentiles,
    /// Kafka timestamp → arrival at its partition worker, per record (the producer, the broker
    /// and the client).
    #[serde(default)]
    pub receive_latency_ms: Percentiles,
    /// Arrival → its batch closed, per record (the batching).
    #[serde(default)]
    pub in_batch_ms: Percentiles,
    /// The end-to-end latency's distribution: `[percentile, ms]` points for plots.
    #[serde(default)]
    pub e2e_distribution_ms: Vec<[f64; 2]>,
    /// Per-stage latency, per transaction.
    pub stages_ms: BTreeMap<String, Percentiles>,
    /// Records per batch.
    pub batch_size: Percentiles,
}

/// A record's arrival at its partition worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// Its Kafka timestamp (Unix ms, set by the producer or the broker), when it has one.
    pub timestamp_ms: Option<i64>,
    /// When it arrived (Unix ms).
    pub at_ms: i64,
}

/// `[percentile, value]` points of `h`, scaled: five per halving of the distance to 100%.
fn distribution(h: &Histogram<u64>, scale: f64) -> Vec<[f64; 2]> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut points: Vec<[f64; 2]> = h
        .iter_quantiles(5)
        .map(|v| {
            [
                v.quantile_iterated_to() * 100.0,
                v.value_iterated_to() as f64 * scale,
            ]
        })
        .take_while(|p| p[0] < 100.0)
        .collect();
    points.push([100.0, h.max() as f64 * scale]);
    points
}

/// Percentiles of a histogram, scaled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// The percentiles of `h`, each value multiplied by `scale` (all zero when `h` is empty).
    /// For the load-test tools, which summarise their own histograms the same way.
    #[doc(hidden)]
    pub fn of(h: &Histogram<u64>, scale: f64) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let q = |x: f64| h.value_at_quantile(x) as f64 * scale;
        Self {
            count: h.len(),
            mean: h.mean() * scale,
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: h.max() as f64 * scale,
        }
    }
}

/// Peak resident set size of this process (VmHWM), in MiB; 0 where /proc is unavailable.
pub(crate) fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU time of this process (user + system, all threads), in seconds; 0 where /proc is
/// unavailable. Linux reports it in clock ticks of 1/100 s.
pub(crate) fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The command name (field 2) may contain spaces: count fields after its closing parenthesis.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: Vec<f64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    ticks.iter().sum::<f64>() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::outcome::StageTimings;

    #[test]
    fn latency_is_measured_from_the_kafka_timestamp_to_the_commit() {
        let m = Metrics::default();
        let commit = UNIX_EPOCH + Duration::from_millis(10_000);
        let opened = Instant::now();
        m.record_batch(
            &BatchSample {
                opened,
                closed: opened + Duration::from_millis(5),
                timings: StageTimings {
                    commit: Duration::from_millis(2),
                    ..StageTimings::default()
                },
                offset_store: Duration::from_micros(10),
                timestamps_ms: &[Some(9_900), Some(9_000), None],
            },
            commit,
        );
        let r = m.measured();
        assert_eq!(r.e2e_latency_ms.count, 2);
        assert!(
            (r.e2e_latency_ms.p50 - 100.0).abs() < 0.5,
            "{:?}",
            r.e2e_latency_ms
        );
        assert!((r.e2e_latency_ms.max - 1000.0).abs() < 1.0);
        assert!((r.stages_ms["batch_wait"].p50 - 5.0).abs() < 0.1);
        assert!((r.stages_ms["commit"].p50 - 2.0).abs() < 0.1);
        assert_eq!(r.batch_size.max, 3.0);
        assert!(peak_rss_mb() > 0.0);
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_seconds() > 0.0);
    }

    #[test]
    fn producer_set_timestamps_at_the_ends_of_i64_do_not_overflow() {
        let m = Metrics::default();
        let opened = Instant::now();
        m.record_batch(
            &BatchSample {
                opened,
                closed: opened,
                timings: StageTimings::default(),
                offset_store: Duration::ZERO,
                timestamps_ms: &[Some(i64::MAX), Some(i64::MIN), Some(i64::MAX / 1000 + 1)],
            },
            UNIX_EPOCH + Duration::from_secs(1),
        );
        let r = m.measured();
        assert_eq!(r.e2e_latency_ms.count, 3);
        // Timestamps in the future count as the smallest latency (1 µs); one at i64::MIN as the
        // largest the histogram holds (one hour).
        assert_eq!(r.e2e_latency_ms.p50, 1e-3);
        assert!(
            (r.e2e_latency_ms.max - 3_600_000.0).abs() < 3_600.0,
            "{:?}",
            r.e2e_latency_ms
        );
    }

    #[test]
    fn arrivals_split_the_latency_at_the_worker() {
        let m = Metrics::default();
        let arrivals = [
            Arrival {
                timestamp_ms: Some(1_000),
                at_ms: 1_100,
            },
            Arrival {
                timestamp_ms: None,
                at_ms: 1_200,
            },
        ];
        m.record_arrivals(&arrivals, 1_300);
        let r = m.measured();
        assert_eq!(
            r.receive_latency_ms.count, 1,
            "only a record with a timestamp"
        );
        assert!((r.receive_latency_ms.p50 - 100.0).abs() < 0.5, "{r:?}");
        assert_eq!(r.in_batch_ms.count, 2);
        assert!((r.in_batch_ms.max - 200.0).abs() < 0.5, "{r:?}");
        // A producer's clock far ahead or far behind saturates instead of overflowing.
        let odd = [Arrival {
            timestamp_ms: Some(i64::MIN),
            at_ms: i64::MAX,
        }];
        m.record_arrivals(&odd, i64::MIN);
    }

    #[test]
    fn the_distribution_ends_at_the_maximum() {
        let mut h = histogram();
        for v in 1..=1000 {
            h.saturating_record(v * 1000);
        }
        let d = distribution(&h, 1e-3);
        assert!(d.len() > 10, "{d:?}");
        let last = d.last().expect("points");
        // Three significant digits: the largest value within 0.1%.
        assert!(
            last[0] == 100.0 && (last[1] - 1000.0).abs() < 1.0,
            "{last:?}"
        );
        assert!(d
            .windows(2)
            .all(|w| w[0][0] <= w[1][0] && w[0][1] <= w[1][1]));
    }
}

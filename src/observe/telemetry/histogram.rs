//! A Prometheus histogram that takes a whole batch of observations under one lock.
//!
//! `prometheus_client`'s histogram locks once per observation; a batch of 1000 records would lock
//! 1000 times for its end-to-end latencies. This one counts a batch's values into its buckets
//! under a single lock, with the same exposition (cumulative `_bucket`, `_sum`, `_count`).

use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Bucketed observations: upper bounds (the last is `+Inf`), a count per bucket, a sum.
#[derive(Debug, Clone)]
pub(crate) struct BatchHistogram {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    sum: f64,
    count: u64,
    /// (upper bound, observations in this bucket only); `encode_histogram` accumulates.
    buckets: Vec<(f64, u64)>,
}

impl BatchHistogram {
    /// A histogram with the given ascending upper bounds, plus `+Inf`.
    pub(crate) fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let buckets = bounds
            .into_iter()
            .chain(std::iter::once(f64::MAX))
            .map(|b| (b, 0))
            .collect();
        Self {
            inner: Arc::new(Mutex::new(Inner {
                sum: 0.0,
                count: 0,
                buckets,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Counts are only ever added to: a panic elsewhere cannot leave them inconsistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds one observation.
    pub(crate) fn observe(&self, value: f64) {
        self.observe_many(std::iter::once(value));
    }

    /// Adds every value of `values` under one lock.
    pub(crate) fn observe_many(&self, values: impl IntoIterator<Item = f64>) {
        let mut inner = self.lock();
        for v in values {
            inner.sum += v;
            inner.count += 1;
            let i = inner.buckets.partition_point(|(upper, _)| *upper < v);
            let last = inner.buckets.len() - 1;
            inner.buckets[i.min(last)].1 += 1;
        }
    }

    /// Number of observations.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.lock().count
    }

    /// Sum of the observations.
    #[cfg(test)]
    pub(crate) fn sum(&self) -> f64 {
        self.lock().sum
    }
}

impl TypedMetric for BatchHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for BatchHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = self.lock();
        encoder.encode_histogram::<NoLabelSet>(inner.sum, inner.count, &inner.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_lands_in_cumulative_buckets() {
        let h = BatchHistogram::new([1.0, 10.0]);
        h.observe_many([0.5, 1.0, 5.0, 50.0]);
        h.observe(10.0);
        assert_eq!(h.count(), 5);
        assert_eq!(h.sum(), 66.5);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("h", "test", h);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        for line in [
            "h_bucket{le=\"1.0\"} 2",
            "h_bucket{le=\"10.0\"} 4",
            "h_bucket{le=\"+Inf\"} 5",
            "h_count 5",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}

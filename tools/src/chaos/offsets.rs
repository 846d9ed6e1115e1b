//! The group's committed offsets, watched from outside the group through the standard consumer
//! API (`committed_offsets`, `fetch_watermarks`), as a lag tool would.
//!
//! Invariant checked: per partition, the committed offset never moves backwards. The watcher
//! never joins the group (it only fetches offsets), so it cannot cause a rebalance.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

const TIMEOUT: Duration = Duration::from_secs(5);

/// Reads a group's committed offsets and a topic's high watermarks.
pub struct GroupOffsets {
    consumer: BaseConsumer,
    topic: String,
    partitions: i32,
}

/// A committed offset that went backwards between two samples.
#[derive(Debug, Clone, Serialize)]
pub struct Regression {
    /// Partition.
    pub partition: i32,
    /// Committed offset before.
    pub from: i64,
    /// Committed offset after.
    pub to: i64,
    /// Seconds since the watch started.
    pub at_s: f64,
}

/// What the sampler saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Samples {
    /// Samples taken.
    pub samples: u64,
    /// Samples that failed (broker busy or unreachable).
    pub failed_samples: u64,
    /// Every backwards move.
    pub regressions: Vec<Regression>,
    /// Times a partition's committed offset moved forward.
    pub advances: u64,
}

/// Committed offset and high watermark of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PartitionLag {
    /// Partition.
    pub partition: i32,
    /// Committed offset (`None`: nothing committed).
    pub committed: Option<i64>,
    /// High watermark (offset of the next record to be written).
    pub high_watermark: i64,
}

impl PartitionLag {
    /// Records not yet committed. A committed offset past the high watermark counts as no lag
    /// here; [`Self::ahead`] tells it (a broker that reports an end below records it served).
    pub fn lag(&self) -> i64 {
        (self.high_watermark - self.committed.unwrap_or(0)).max(0)
    }

    /// The committed offset is past the high watermark.
    pub fn ahead(&self) -> bool {
        self.committed.is_some_and(|c| c > self.high_watermark)
    }
}

impl GroupOffsets {
    /// A watcher of `group` on `topic` (partitions `0..partitions`).
    pub fn new(
        brokers: &str,
        group: &str,
        topic: &str,
        partitions: i32,
    ) -> Result<Self, KafkaError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()?;
        Ok(Self {
            consumer,
            topic: topic.to_owned(),
            partitions,
        })
    }

    /// Committed offset per partition (`None`: nothing committed yet). Blocking.
    pub fn committed(&self) -> Result<Vec<Option<i64>>, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition(&self.topic, p);
        }
        let got = self.consumer.committed_offsets(tpl, TIMEOUT)?;
        let mut out = Vec::with_capacity(self.partitions.max(0) as usize);
        for p in 0..self.partitions {
            let elem = got.find_partition(&self.topic, p);
            // A partition answered with an error is an unknown sample, not "nothing committed".
            if let Some(Err(e)) = elem.as_ref().map(|e| e.error()) {
                return Err(e);
            }
            out.push(match elem.map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            });
        }
        Ok(out)
    }

    /// Committed offset and high watermark of every partition. Blocking.
    pub fn lag(&self) -> Result<Vec<PartitionLag>, KafkaError> {
        let committed = self.committed()?;
        let mut out = Vec::with_capacity(committed.len());
        for (p, committed) in (0..self.partitions).zip(committed) {
            let (_, high) = self.consumer.fetch_watermarks(&self.topic, p, TIMEOUT)?;
            out.push(PartitionLag {
                partition: p,
                committed,
                high_watermark: high,
            });
        }
        Ok(out)
    }

    /// Polls until every partition's lag is 0 or `deadline`; returns the last observation.
    pub fn wait_for_zero_lag(&self, deadline: Instant) -> Vec<PartitionLag> {
        let mut last = Vec::new();
        loop {
            if let Ok(lag) = self.lag() {
                let done = lag.iter().all(|l| l.lag() == 0);
                last = lag;
                if done {
                    return last;
                }
            }
            if Instant::now() >= deadline {
                return last;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Samples committed offsets every `every` on a thread until `stop` is set; times are seconds
/// since `started`.
pub fn spawn_sampler(
    watch: GroupOffsets,
    every: Duration,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Samples> {
    std::thread::spawn(move || {
        let mut samples = Samples::default();
        let mut last: Vec<Option<i64>> = vec![None; watch.partitions.max(0) as usize];
        while !stop.load(Ordering::Acquire) {
            match watch.committed() {
                Ok(now) => {
                    samples.samples += 1;
                    record(
                        &mut samples,
                        &mut last,
                        &now,
                        started.elapsed().as_secs_f64(),
                    );
                }
                Err(_) => samples.failed_samples += 1,
            }
            std::thread::sleep(every);
        }
        samples
    })
}

/// Compares one sample with the previous one.
pub(crate) fn record(
    samples: &mut Samples,
    last: &mut [Option<i64>],
    now: &[Option<i64>],
    at_s: f64,
) {
    for (p, (before, after)) in last.iter_mut().zip(now).enumerate() {
        match (*before, *after) {
            (Some(from), Some(to)) if to < from => samples.regressions.push(Regression {
                partition: p as i32,
                from,
                to,
                at_s,
            }),
            (Some(from), Some(to)) if to > from => samples.advances += 1,
            (None, Some(_)) => samples.advances += 1,
            // A committed offset that disappears is a regression to nothing.
            (Some(from), None) => samples.regressions.push(Regression {
                partition: p as i32,
                from,
                to: -1,
                at_s,
            }),
            _ => {}
        }
        if after.is_some() || before.is_none() {
            *before = *after;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_committed_offset_moving_backwards_is_a_regression() {
        let mut s = Samples::default();
        let mut last = vec![None, None];
        record(&mut s, &mut last, &[Some(5), None], 1.0);
        record(&mut s, &mut last, &[Some(9), Some(2)], 2.0);
        record(&mut s, &mut last, &[Some(9), Some(2)], 3.0);
        assert!(s.regressions.is_empty());
        assert_eq!(s.advances, 3);
        record(&mut s, &mut last, &[Some(7), None], 4.0);
        assert_eq!(s.regressions.len(), 2);
        assert_eq!(
            (
                s.regressions[0].partition,
                s.regressions[0].from,
                s.regressions[0].to
            ),
            (0, 9, 7)
        );
        assert_eq!((s.regressions[1].partition, s.regressions[1].to), (1, -1));
        // The next sample compares with the latest one.
        record(&mut s, &mut last, &[Some(8), Some(2)], 5.0);
        assert_eq!(s.regressions.len(), 2);
    }
}

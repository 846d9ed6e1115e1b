//! `--exit-on-eof`: when the topic is done for the whole consumer group, not only for this member.
//!
//! Invariant: the processor exits on EOF only when, for EVERY partition of the topic, the group's
//! committed offset (whoever holds the partition) has reached the partition's end. A member whose
//! own partitions are drained keeps waiting, through rebalances, while another member holds
//! uncommitted records: a member that was killed still holds its partitions until its session
//! expires, and a member with no partition at all has nothing of its own to drain. Exit 0 then
//! means "every record of the topic is applied", which is what a backfill's operator reads it as.
//!
//! The check uses only the standard consumer API (metadata, `OffsetFetch` for the group,
//! `ListOffsets` for the ends), so it works with any Kafka-protocol broker.

use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

/// Longest wait for one broker request of the check.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where one partition stands for the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionEnd {
    /// The partition.
    pub partition: i32,
    /// The group's committed offset (`None`: the group never committed one).
    pub committed: Option<i64>,
    /// Offset of the partition's first record still kept by the broker.
    pub low: i64,
    /// Offset of the next record to be written (the end).
    pub high: i64,
}

impl PartitionEnd {
    /// True when every record of the partition is committed by the group: the committed offset
    /// is at the end, or nothing was ever committed and the broker keeps no record.
    pub fn is_done(&self) -> bool {
        match self.committed {
            Some(c) => c >= self.high,
            None => self.low >= self.high,
        }
    }
}

/// The partitions not yet done, as `p<partition>: <committed>/<end>` for a log line; empty when the
/// whole topic is done. An empty topic description (no partition known) is not done.
pub fn pending(ends: &[PartitionEnd]) -> Option<Vec<String>> {
    if ends.is_empty() {
        return Some(vec!["no partition known yet".to_owned()]);
    }
    let left: Vec<String> = ends
        .iter()
        .filter(|e| !e.is_done())
        .map(|e| match e.committed {
            Some(c) => format!("p{}: {c}/{}", e.partition, e.high),
            None => format!("p{}: none/{}", e.partition, e.high),
        })
        .collect();
    (!left.is_empty()).then_some(left)
}

/// Reads, for `group` (the consumer's own), the committed offset and the ends of every partition
/// of `topic`. Blocking: run it off the async threads.
pub fn partition_ends<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
    consumer: &C,
    topic: &str,
) -> KafkaResult<Vec<PartitionEnd>> {
    let metadata = consumer.fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
    let mut tpl = TopicPartitionList::new();
    for t in metadata.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            tpl.add_partition(topic, p.id());
        }
    }
    let committed = consumer.committed_offsets(tpl.clone(), REQUEST_TIMEOUT)?;
    let mut ends = Vec::with_capacity(tpl.count());
    for elem in tpl.elements() {
        let partition = elem.partition();
        let stored = committed.find_partition(topic, partition);
        if let Some(Err(e)) = stored.as_ref().map(|s| s.error()) {
            return Err(e);
        }
        let committed = match stored.map(|s| s.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        };
        let (low, high) = consumer.fetch_watermarks(topic, partition, REQUEST_TIMEOUT)?;
        ends.push(PartitionEnd {
            partition,
            committed,
            low,
            high,
        });
    }
    Ok(ends)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(partition: i32, committed: Option<i64>, low: i64, high: i64) -> PartitionEnd {
        PartitionEnd {
            partition,
            committed,
            low,
            high,
        }
    }

    #[test]
    fn a_partition_is_done_when_the_group_committed_its_end() {
        assert!(end(0, Some(10), 0, 10).is_done());
        assert!(end(0, Some(11), 0, 10).is_done());
        assert!(!end(0, Some(9), 0, 10).is_done());
        assert!(!end(0, None, 0, 10).is_done(), "records, nothing committed");
        assert!(end(0, None, 0, 0).is_done(), "an empty partition");
        assert!(end(0, None, 7, 7).is_done(), "every record expired");
    }

    #[test]
    fn the_topic_is_done_only_when_every_partition_is() {
        let half = [end(0, Some(10), 0, 10), end(1, Some(3), 0, 8)];
        assert_eq!(pending(&half), Some(vec!["p1: 3/8".to_owned()]));
        let none = [end(0, Some(10), 0, 10), end(1, None, 0, 8)];
        assert_eq!(pending(&none), Some(vec!["p1: none/8".to_owned()]));
        let all = [end(0, Some(10), 0, 10), end(1, Some(8), 0, 8)];
        assert_eq!(pending(&all), None);
        assert!(pending(&[]).is_some(), "no metadata is not done");
    }
}

//! Reads the whole topic back after a chaos run, outside the group, to tell a message the broker
//! lost from one the processors skipped.
//!
//! Invariant: reading never touches the group's offsets (partitions are assigned, not
//! subscribed, and nothing is committed).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};
use uuid::Uuid;

/// What the topic holds.
#[derive(Debug, Clone, Default)]
pub struct TopicContents {
    /// Records read.
    pub records: u64,
    /// Distinct ids (header `id`) that parse as UUIDs, with the partition and offset of their
    /// first record.
    pub ids: HashMap<Uuid, (i32, i64)>,
    /// Every partition was read to its end before the deadline.
    pub complete: bool,
    /// Records whose offset is not the previous record's (of the same partition) + 1: a broker
    /// that gives two records one offset, or skips offsets. Never expected with this producer.
    pub out_of_sequence: u64,
    /// The first of those, as (partition, expected offset, offset read).
    pub out_of_sequence_at: Vec<(i32, i64, i64)>,
}

impl TopicContents {
    /// Counts `offset` of `partition` against the previous record's.
    fn check_sequence(&mut self, last: &mut HashMap<i32, i64>, partition: i32, offset: i64) {
        if let Some(prev) = last.insert(partition, offset) {
            if offset != prev + 1 {
                self.out_of_sequence += 1;
                if self.out_of_sequence_at.len() < 10 {
                    self.out_of_sequence_at.push((partition, prev + 1, offset));
                }
            }
        }
    }
}

/// Reads every partition from the beginning to its end (or until `deadline`).
pub fn read_all(
    brokers: &str,
    topic: &str,
    partitions: i32,
    deadline: Instant,
) -> Result<TopicContents, KafkaError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "batch-inbox-chaos-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut at_end: HashSet<i32> = HashSet::new();
    let mut out = TopicContents::default();
    let mut last_offset: HashMap<i32, i64> = HashMap::new();
    // Some brokers report a partition's end before its last records: keep reading a moment
    // after every partition reported its end.
    let mut linger_until: Option<Instant> = None;
    while Instant::now() < linger_until.unwrap_or(deadline).min(deadline) {
        if linger_until.is_none() && at_end.len() as i32 == partitions {
            linger_until = Some(Instant::now() + Duration::from_millis(1500));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                out.records += 1;
                out.check_sequence(&mut last_offset, m.partition(), m.offset());
                let id = m.headers().and_then(|hs| {
                    hs.iter()
                        .find(|h| h.key == "id")
                        .and_then(|h| h.value)
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .and_then(|s| Uuid::try_parse(s.trim()).ok())
                });
                if let Some(id) = id {
                    out.ids.entry(id).or_insert((m.partition(), m.offset()));
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(_)) | None => {}
        }
    }
    out.complete = at_end.len() as i32 == partitions;
    Ok(out)
}

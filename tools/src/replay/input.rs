//! The replay's input: the load test's records, generated in memory, keyed to partitions like the
//! producer does it, cut into per-partition batches and decoded before the clock starts.
//!
//! Invariant: each partition's batches hold its records in production order with consecutive
//! offsets from 0, and every generated record is in exactly one batch.

use std::sync::Arc;

use crate::generate::{generate, Expected, GeneratorSettings, Record};
use batch_inbox::internals::message::Decoded;
use batch_inbox::{Header, RawMessage};
use bytes::Bytes;

/// The batches of one partition, in offset order.
pub struct PartitionInput<P> {
    /// Partition number.
    pub partition: i32,
    /// Decoded batches, ready for the inbox transaction.
    pub batches: Vec<Decoded<P>>,
}

/// Generated records grouped by partition, with the model's expected outcome.
pub struct Input {
    /// Raw records per partition (index = partition), in production order.
    pub partitions: Vec<Vec<RawMessage>>,
    /// What applying every record must leave in the database.
    pub expected: Expected,
}

/// Generates the records of `settings` and routes each one to its partition.
pub fn build(settings: GeneratorSettings, topic: &str, partitions: i32) -> Input {
    let (records, expected) = generate(settings);
    let topic: Arc<str> = Arc::from(topic);
    let mut by_partition: Vec<Vec<RawMessage>> = vec![Vec::new(); partitions as usize];
    for record in records {
        let partition = partition_of(record.key.as_bytes(), partitions);
        let queue = &mut by_partition[partition as usize];
        let offset = queue.len() as i64;
        queue.push(raw_message(&topic, partition, offset, record));
    }
    Input {
        partitions: by_partition,
        expected,
    }
}

/// Cuts each partition's records into batches of at most `batch_size` and decodes them with
/// `decode` (the inbox's own decoder).
pub fn batches<P>(
    partitions: Vec<Vec<RawMessage>>,
    batch_size: usize,
    decode: impl Fn(Vec<RawMessage>) -> Decoded<P>,
) -> Vec<PartitionInput<P>> {
    partitions
        .into_iter()
        .enumerate()
        .map(|(partition, records)| {
            let mut batches = Vec::with_capacity(records.len().div_ceil(batch_size));
            let mut records = records.into_iter().peekable();
            while records.peek().is_some() {
                batches.push(decode(records.by_ref().take(batch_size).collect()));
            }
            PartitionInput {
                partition: partition as i32,
                batches,
            }
        })
        .collect()
}

fn raw_message(topic: &Arc<str>, partition: i32, offset: i64, record: Record) -> RawMessage {
    let headers = record
        .id
        .map(|id| Header {
            key: Bytes::from_static(b"id"),
            value: Some(Bytes::from(id.into_bytes())),
        })
        .into_iter()
        .collect();
    RawMessage {
        topic: topic.clone(),
        partition,
        offset,
        timestamp_ms: None,
        key: Some(Bytes::from(record.key.into_bytes())),
        payload: record.value.map(Bytes::from),
        headers,
        header_error: None,
    }
}

/// The partition librdkafka's default partitioner (`consistent_random`) gives a non-empty key:
/// the CRC-32 (IEEE) of the key modulo the partition count.
pub fn partition_of(key: &[u8], partitions: i32) -> i32 {
    (crc32(key) % partitions.max(1) as u32) as i32
}

/// CRC-32 with the IEEE polynomial (reflected 0xEDB88320), bit by bit: the keys are a few bytes.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }
}

//! Where a newly assigned partition starts: from the offset stored in the database (in the same
//! transaction as the batches' effects) when it is ahead of Kafka's committed offset.
//!
//! Invariant: a start offset is only ever moved forward from Kafka's committed one, and only to
//! a position the database says is committed; any failure to read either position leaves the
//! assignment as it was (Kafka's committed offset: a replay, which the inbox makes harmless).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::consumer::{AssignHook, GroupContext};
use crate::offset_table;
use crate::stats::Stats;

/// How long an assignment waits for each of the two positions.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The hook that starts assigned partitions from the offsets `group` stored in the database.
/// Every record skipped that way is counted in `stats.replays_avoided`.
pub(crate) fn from_database(pool: Pool, group: Arc<str>, stats: Arc<Stats>) -> AssignHook {
    Box::new(move |consumer, tpl| {
        if let Err(e) = set_start_offsets(consumer, tpl, &pool, &group, &stats) {
            tracing::warn!("starting from Kafka's committed offsets: {e}");
        }
    })
}

fn set_start_offsets(
    consumer: &BaseConsumer<GroupContext>,
    tpl: &mut TopicPartitionList,
    pool: &Pool,
    group: &str,
    stats: &Stats,
) -> Result<(), String> {
    let by_topic = partitions_by_topic(tpl);
    if by_topic.is_empty() {
        return Ok(());
    }
    let stored = read_stored(pool, group, &by_topic)?;
    if stored.is_empty() {
        return Ok(());
    }
    let mut query = TopicPartitionList::new();
    for (topic, partition) in stored.keys() {
        query.add_partition(topic, *partition);
    }
    let committed = consumer
        .committed_offsets(query, LOOKUP_TIMEOUT)
        .map_err(|e| format!("cannot read Kafka's committed offsets: {e}"))?;
    for ((topic, partition), db_next) in stored {
        let kafka_next =
            committed
                .find_partition(&topic, partition)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
        if kafka_next.is_some_and(|k| k >= db_next) {
            continue;
        }
        tpl.set_partition_offset(&topic, partition, Offset::Offset(db_next))
            .map_err(|e| e.to_string())?;
        let skipped = db_next - kafka_next.unwrap_or(0).max(0);
        stats
            .replays_avoided
            .fetch_add(skipped as u64, Ordering::Relaxed);
        tracing::info!(
            topic,
            partition,
            db_next,
            kafka_next,
            "starting from the offset stored in the database, ahead of Kafka's"
        );
    }
    Ok(())
}

fn partitions_by_topic(tpl: &TopicPartitionList) -> HashMap<String, Vec<i32>> {
    let mut by_topic: HashMap<String, Vec<i32>> = HashMap::new();
    for e in tpl.elements() {
        by_topic
            .entry(e.topic().to_owned())
            .or_default()
            .push(e.partition());
    }
    by_topic
}

/// Reads the stored offsets, blocking the rebalance callback (which is synchronous) on the
/// pool. Needs a multi-thread runtime: blocking a current-thread one would deadlock.
fn read_stored(
    pool: &Pool,
    group: &str,
    by_topic: &HashMap<String, Vec<i32>>,
) -> Result<HashMap<(String, i32), i64>, String> {
    let rt = tokio::runtime::Handle::try_current().map_err(|e| e.to_string())?;
    if rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return Err("offsets in the database need a multi-thread runtime".to_owned());
    }
    tokio::task::block_in_place(|| {
        rt.block_on(async {
            let mut all = HashMap::new();
            for (topic, partitions) in by_topic {
                let read = offset_table::read(pool, group, topic, partitions);
                let found = tokio::time::timeout(LOOKUP_TIMEOUT, read)
                    .await
                    .map_err(|_| "timed out reading consumer_offsets".to_owned())?
                    .map_err(|e| format!("cannot read consumer_offsets: {e}"))?;
                all.extend(found.into_iter().map(|(p, o)| ((topic.clone(), p), o)));
            }
            Ok(all)
        })
    })
}

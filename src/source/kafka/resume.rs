//! Where a newly assigned partition starts: from the offset stored in the database (in the same
//! transaction as the batches' effects), ahead of Kafka's committed offset or behind it.
//!
//! Invariant: the database is the system of record, positions included. A partition of a topic
//! the database knows for the group starts at the database's position whatever Kafka remembers:
//! ahead (records committed in the database, not yet in Kafka) or behind (the database went back
//! in time: a restore, a failover to a replica that lagged; the records between are read again
//! and the inbox skips what the database holds). Kafka's committed offset then follows the
//! database's. A failure to read the database's positions leaves the assignment at Kafka's
//! committed offsets (logged); the first offset write of each partition then finds the database's
//! position (a compare-and-set) and moves the partition there.
//!
//! Offsets belong to one incarnation of a topic: its Kafka topic id, recorded in
//! `consumer_topics` the first time the group resumes the topic from the database. When the
//! broker's topic has another id (deleted and re-created), the stored offsets point into a log
//! that no longer exists: its partitions are left out of the assignment (nothing of them is
//! consumed) and the processor stops with [`RunError::TopicReplaced`]. When the ids cannot be
//! read (the request fails or times out), the check fails closed: nothing is consumed and the
//! processor stops ([`RunError::PositionsUnread`]). A broker without topic ids (the all-zero id),
//! a topic it refuses to describe, or a cluster whose metadata names no controller of its own
//! (librdkafka's mock cluster; told from the metadata at once, never after a timeout) keeps the
//! database's positions unchecked (logged at debug level).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc::UnboundedSender;
use uuid::Uuid;

use crate::db::sql::{READ_TOPIC_IDS, RECORD_TOPIC_ID};
use crate::error::{one_line_error, RunError};
use crate::observe::stats::Stats;
use crate::source::kafka::consumer::{AssignHook, GroupContext};
use crate::source::kafka::topic_id::{self, Described};
use crate::source::positions;

/// How long an assignment waits for each of the two positions.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Attempts at reading the positions of an assignment before the processor stops, 1, 2, 4 and
/// 8 s apart (a database restarting, a failover in progress).
const LOOKUP_ATTEMPTS: u32 = 5;

/// Waits before attempt `attempt` + 1 (blocking: the rebalance callback is synchronous).
fn back_off(attempt: u32) {
    std::thread::sleep(Duration::from_secs(1 << attempt.saturating_sub(1).min(3)));
}

/// The hook that starts assigned partitions from the offsets `group` stored in the database.
/// Every record skipped that way is counted in `stats.replays_avoided`. A topic whose stored
/// offsets belong to another topic id is left out of the assignment and reported to `failures`.
pub(crate) fn from_database(
    pool: Pool,
    group: Arc<str>,
    stats: Arc<Stats>,
    failures: UnboundedSender<RunError>,
) -> AssignHook {
    Box::new(move |consumer, tpl| {
        let topics: Vec<String> = partitions_by_topic(tpl).into_keys().collect();
        let rk = consumer.client().native_ptr();
        let mut attempts = 0;
        let replaced = loop {
            match replaced_topics(rk, &topics, &pool, &group, true) {
                Ok(replaced) => break replaced,
                Err(e) if attempts + 1 < LOOKUP_ATTEMPTS => {
                    attempts += 1;
                    tracing::warn!("cannot check the topics' ids, will retry: {e}");
                    back_off(attempts);
                }
                Err(e) => {
                    // The database's offsets may belong to a deleted topic: moving the
                    // partitions there could skip the new topic's records. Nothing is consumed.
                    remove_partitions(tpl, |_, _| true);
                    let detail = format!("cannot check the topics' ids: {e}");
                    let _ = failures.send(RunError::PositionsUnread { detail });
                    return;
                }
            }
        };
        for failure in replaced {
            if let RunError::TopicReplaced { topic, .. } = &failure {
                remove_partitions(tpl, |t, _| t == topic);
            }
            let _ = failures.send(failure);
        }
        let mut attempts = 0;
        while let Err(e) = set_start_offsets(consumer, tpl, &pool, &group, &stats) {
            attempts += 1;
            if attempts < LOOKUP_ATTEMPTS {
                tracing::warn!("cannot read the partitions' positions, will retry: {e}");
                back_off(attempts);
                continue;
            }
            // Kafka's committed offsets may be ahead of the database (a restore, a failover):
            // starting there could skip records. Nothing is consumed; the processor stops.
            remove_partitions(tpl, |_, _| true);
            let _ = failures.send(RunError::PositionsUnread { detail: e });
            break;
        }
    })
}

/// Removes from `tpl` every partition for which `drop` holds, in place: the list belongs to
/// librdkafka's rebalance event, which frees it, so it is never replaced.
fn remove_partitions(tpl: &mut TopicPartitionList, drop: impl Fn(&str, i32) -> bool) {
    let doomed: Vec<(String, i32)> = tpl
        .elements()
        .iter()
        .filter(|e| drop(e.topic(), e.partition()))
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect();
    for (topic, partition) in doomed {
        let Ok(name) = std::ffi::CString::new(topic) else {
            continue; // a topic name from librdkafka holds no NUL byte
        };
        // SAFETY: `tpl` is a live list for the call, and `name` a NUL-terminated string that
        // outlives it; librdkafka removes the element and frees what it owned.
        unsafe {
            rdkafka_sys::bindings::rd_kafka_topic_partition_list_del(
                tpl.ptr(),
                name.as_ptr(),
                partition,
            );
        }
    }
}

/// What the database knows of one topic for the group: the recorded id, and whether it has
/// offsets.
struct Recorded {
    id: Option<Uuid>,
    has_offsets: bool,
}

/// Fails with [`RunError::TopicReplaced`] when a topic of `topics` has stored offsets of another
/// topic id: run at start, before anything is consumed (the `--exit-on-eof` check would
/// otherwise count the old offsets as the new topic's). A failure to tell is logged, not fatal
/// here: each assignment checks again, and fails closed.
pub(crate) fn check_at_start(
    rk: *mut rdkafka_sys::bindings::rd_kafka_t,
    topics: &[String],
    pool: &Pool,
    group: &str,
) -> Result<(), RunError> {
    match tokio::task::block_in_place(|| replaced_topics(rk, topics, pool, group, false)) {
        Ok(mut replaced) if !replaced.is_empty() => Err(replaced.swap_remove(0)),
        Ok(_) => Ok(()),
        Err(e) => {
            tracing::warn!("cannot check the topics' ids against the database: {e}");
            Ok(())
        }
    }
}

/// The topics of `topics` whose stored offsets belong to another topic id, as failures; with
/// `record`, records the id of every other one that has none recorded yet. `rk` is the
/// consumer's client handle.
fn replaced_topics(
    rk: *mut rdkafka_sys::bindings::rd_kafka_t,
    topics: &[String],
    pool: &Pool,
    group: &str,
    record: bool,
) -> Result<Vec<RunError>, String> {
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    // SAFETY: the callers pass the handle of a consumer they hold for the call.
    if !unsafe { topic_id::can_describe(rk, LOOKUP_TIMEOUT) }? {
        tracing::debug!("the cluster names no controller of its own: topic ids not checked");
        return Ok(Vec::new());
    }
    // SAFETY: as above.
    let described = unsafe { topic_id::describe(rk, &names, LOOKUP_TIMEOUT) }?;
    let recorded = block_on_pool(async {
        let client = pool.get().await.map_err(|e| one_line_error(&e))?;
        let rows = client
            .query(READ_TOPIC_IDS, &[&group, &topics])
            .await
            .map_err(|e| format!("cannot read consumer_topics: {}", one_line_error(&e)))?;
        let by_topic: HashMap<String, Recorded> = rows
            .iter()
            .map(|r| {
                let recorded = Recorded {
                    id: r.get(1),
                    has_offsets: r.get(2),
                };
                (r.get(0), recorded)
            })
            .collect();
        Ok::<_, String>(by_topic)
    })?;
    let mut failures = Vec::new();
    let mut to_record = Vec::new();
    for topic in topics {
        let current = match described.get(topic) {
            Some(Described::Id(Some(id))) => *id,
            Some(Described::Id(None)) => {
                tracing::debug!(topic, "the broker reports no topic id: not checked");
                continue;
            }
            Some(Described::Refused(why)) => {
                tracing::warn!(
                    topic,
                    "cannot describe the topic, its id is not checked: {why}"
                );
                continue;
            }
            None => continue,
        };
        let Some(recorded) = recorded.get(topic) else {
            continue;
        };
        match recorded.id {
            Some(stored) if stored != current && recorded.has_offsets => {
                failures.push(replaced(topic, group, stored, current));
            }
            Some(stored) if stored == current => {}
            _ => to_record.push((topic.clone(), current)),
        }
    }
    if record && !to_record.is_empty() {
        // Best effort: a database that refuses the write (read-only, a grant) leaves the id to be
        // recorded at a later assignment; the comparison above is what keeps records safe.
        let recorded = block_on_pool(async {
            let client = pool.get().await.map_err(|e| one_line_error(&e))?;
            for (topic, id) in &to_record {
                client
                    .execute(RECORD_TOPIC_ID, &[&group, topic, id])
                    .await
                    .map_err(|e| format!("cannot record the topic id: {}", one_line_error(&e)))?;
            }
            Ok::<_, String>(())
        });
        if let Err(e) = recorded {
            tracing::warn!("{e}");
        }
    }
    Ok(failures)
}

/// The failure for `topic`, whose offsets of `group` belong to topic id `stored` while the
/// broker's topic has id `current`, with the reset an operator runs before starting again.
///
/// The reset deletes the group's offsets and recorded id of the topic, and the inbox rows whose
/// keys were derived from the old topic's positions (`--id-from position`, and a tombstone passed
/// on without its id header): a position key is a pure function of topic, partition and offset
/// ([`crate::source::key::position_key`]), so the new topic's record at the same position would
/// get the same key and be skipped as a duplicate of the old one. Such a row is told apart
/// exactly: its `message_id` is the position key of its own `topic`, `partition` and `offset`
/// columns (the record's position, written with the id), recomputed in SQL from the key's bytes
/// (SHA-256, then the version-8 and variant bits). Any other row of the topic stays: a UUID
/// id, or a key derived from an id value (`--id-format any`), names the message itself, and a
/// copy of it in the new topic is the same message, still a duplicate. Rows of other topics
/// are never matched (`topic` is compared, and hashed). The statement reads every inbox row of
/// the topic once (there is no index on `topic`), which a one-off reset can afford.
fn replaced(topic: &str, group: &str, stored: Uuid, current: Uuid) -> RunError {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let (g, t) = (quote(group), quote(topic));
    // The bytes hashed in front of a position (the table of `crate::source::key`): the
    // namespace, the kind 0x02 (a position), the topic name's length (big-endian) and the name.
    let mut prefix = crate::source::key::NAMESPACE.as_bytes().to_vec();
    prefix.push(0x02);
    prefix.extend(u32::try_from(topic.len()).unwrap_or(u32::MAX).to_be_bytes());
    prefix.extend(topic.as_bytes());
    let hex: String = prefix.iter().map(|b| format!("{b:02x}")).collect();
    RunError::TopicReplaced {
        topic: topic.to_owned(),
        group: group.to_owned(),
        stored,
        current,
        reset: format!(
            "DELETE FROM consumer_offsets WHERE group_id = {g} AND topic = {t}; \
             DELETE FROM consumer_topics WHERE group_id = {g} AND topic = {t}; \
             DELETE FROM inbox AS i WHERE i.topic = {t} AND i.message_id = (SELECT \
             encode(set_byte(set_byte(h, 6, (get_byte(h, 6) & 15) | 128), 8, \
             (get_byte(h, 8) & 63) | 128), 'hex')::uuid FROM (SELECT substr(sha256(\
             decode('{hex}', 'hex') || int4send(i.partition) || int8send(i.\"offset\")), 1, 16) \
             AS h) AS k);"
        ),
    }
}

/// Sets the start offset of every assigned partition of a topic the database knows for `group`
/// to the database's position, ahead of Kafka's committed offset or behind it. Behind means the
/// database lost commits (a restore, a failover to a replica that lagged): the records between
/// are read again, the inbox skipping what the database holds, with one WARN line and the gap
/// counted. A partition without a row of a topic the database knows (restored from before its
/// first commit) starts at its beginning. A topic the database has never seen starts at
/// Kafka's committed offsets.
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
    let known: Vec<(String, i32)> = by_topic
        .iter()
        .filter(|(topic, _)| stored.contains_key(*topic))
        .flat_map(|(topic, ps)| ps.iter().map(move |p| (topic.clone(), *p)))
        .collect();
    if known.is_empty() {
        return Ok(());
    }
    let mut query = TopicPartitionList::new();
    for (topic, partition) in &known {
        query.add_partition(topic, *partition);
    }
    let committed = consumer
        .committed_offsets(query, LOOKUP_TIMEOUT)
        .map_err(|e| format!("cannot read Kafka's committed offsets: {e}"))?;
    let mut lost = Vec::new();
    for (topic, partition) in known {
        let kafka_next =
            committed
                .find_partition(&topic, partition)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
        let db_next = stored.get(&topic).and_then(|t| t.get(&partition)).copied();
        if let Some(db_next) = db_next {
            let (log_start, _) = consumer
                .fetch_watermarks(&topic, partition, LOOKUP_TIMEOUT)
                .map_err(|e| format!("cannot read {topic}/{partition}'s log start: {e}"))?;
            if db_next < log_start {
                lost.push((topic, partition, db_next, log_start));
                continue;
            }
        }
        stats.telemetry.stalls.resumed(&topic, partition);
        let start = Start::decide(db_next, kafka_next);
        let offset = db_next.map_or(Offset::Beginning, Offset::Offset);
        tpl.set_partition_offset(&topic, partition, offset)
            .map_err(|e| e.to_string())?;
        start.report(&topic, partition, db_next, kafka_next, stats);
    }
    if !lost.is_empty() {
        remove_partitions(tpl, |t, p| lost.iter().any(|l| l.0 == t && l.1 == p));
        for (topic, partition, db_next, log_start) in &lost {
            stall_on_lost(stats, group, topic, *partition, *db_next, *log_start);
        }
    }
    Ok(())
}

/// What a lost partition's stall says (`/readyz`, the stalled gauge).
const LOST: &str = "records lost: the database's position is before the log's start";

/// The database's position of a partition is before its log's start: the records between are
/// gone for good (deleted by Kafka's retention before they were applied, or the database was
/// restored from a backup older than the topic's retention). Never skipped in silence: the
/// partition is not consumed here and stalls visibly until an operator accepts the loss (sets the
/// position with `positions set`, which records it) and the partition is assigned again.
fn stall_on_lost(
    stats: &Stats,
    group: &str,
    topic: &str,
    partition: i32,
    db_next: i64,
    log_start: i64,
) {
    stats.telemetry.stalls.records_lost(topic, partition, LOST);
    tracing::error!(
        topic,
        partition,
        db_next,
        log_start,
        "records {db_next}..{} of {topic}/{partition} are gone: the database's position is \
         before the partition's log start, Kafka deleted them before they were applied. The \
         partition is stalled, nothing skipped. To accept the loss: batch-inbox positions set \
         --group {group} --topic {topic} --partition {partition} --to-earliest --reason '...', \
         then restart the processor",
        log_start - 1
    );
}

/// Where an assigned partition starts, against Kafka's committed offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// At Kafka's committed offset, which is the database's.
    Same,
    /// Ahead of Kafka's committed offset: the records between are committed in the database.
    Ahead(i64),
    /// Behind Kafka's committed offset by this many records: the database lost commits.
    Behind(i64),
    /// At the partition's beginning: no row for it in the database, which knows its topic,
    /// while Kafka has a committed offset for it (the database lost the partition's commits).
    Beginning,
    /// At the partition's beginning: neither the database nor Kafka has a position for it (a
    /// partition added to the topic).
    New,
}

impl Start {
    fn decide(db_next: Option<i64>, kafka_next: Option<i64>) -> Self {
        match (db_next, kafka_next) {
            (None, Some(_)) => Start::Beginning,
            (None, None) => Start::New,
            (Some(d), Some(k)) if d < k => Start::Behind(k - d),
            (Some(d), Some(k)) if d == k => Start::Same,
            (Some(d), k) => Start::Ahead(d - k.unwrap_or(0).max(0)),
        }
    }

    fn report(
        self,
        topic: &str,
        partition: i32,
        db_next: Option<i64>,
        kafka_next: Option<i64>,
        stats: &Stats,
    ) {
        match self {
            Start::Same => {}
            Start::New => tracing::info!(
                topic,
                partition,
                "a partition without a position anywhere: starting at its beginning"
            ),
            Start::Ahead(skipped) => {
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
            Start::Behind(gap) => {
                stats.record_rewind(gap as u64);
                tracing::warn!(
                    topic,
                    partition,
                    db_next,
                    kafka_next,
                    gap,
                    "the database's position is behind Kafka's committed offset by {gap} \
                     records: the database went back in time (a restore, a failover to a replica \
                     that lagged); reading them again from the database's position, the inbox \
                     skipping what it holds"
                );
            }
            Start::Beginning => {
                stats.record_rewind(kafka_next.unwrap_or(0).max(0) as u64);
                tracing::warn!(
                    topic,
                    partition,
                    kafka_next,
                    "the database knows the topic but holds no position for this partition (a \
                     restore from before its first commit): starting at the partition's \
                     beginning, the inbox skipping what it holds"
                );
            }
        }
    }
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

/// Runs `work` on the pool from the rebalance callback (which is synchronous), within
/// [`LOOKUP_TIMEOUT`]. Needs a multi-thread runtime: blocking a current-thread one would
/// deadlock.
fn block_on_pool<T>(
    work: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    let rt = tokio::runtime::Handle::try_current().map_err(|e| e.to_string())?;
    if rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return Err("offsets in the database need a multi-thread runtime".to_owned());
    }
    tokio::task::block_in_place(|| {
        rt.block_on(async {
            tokio::time::timeout(LOOKUP_TIMEOUT, work)
                .await
                .map_err(|_| "timed out reading the database".to_owned())?
        })
    })
}

/// Reads the stored offsets of every partition of the assigned topics (a topic with a row for
/// any of its partitions is known to the database), blocking the rebalance callback on the pool.
fn read_stored(
    pool: &Pool,
    group: &str,
    by_topic: &HashMap<String, Vec<i32>>,
) -> Result<HashMap<String, HashMap<i32, i64>>, String> {
    block_on_pool(async {
        let mut all = HashMap::new();
        for topic in by_topic.keys() {
            let found = positions::read_topic(pool, group, topic)
                .await
                .map_err(|e| format!("cannot read consumer_offsets: {e}"))?;
            if !found.is_empty() {
                all.insert(topic.clone(), found);
            }
        }
        Ok(all)
    })
}

#[cfg(test)]
mod tests {
    use super::Start;

    #[test]
    fn the_database_position_wins_in_both_directions() {
        assert_eq!(Start::decide(Some(10), Some(10)), Start::Same);
        assert_eq!(Start::decide(Some(15), Some(10)), Start::Ahead(5));
        assert_eq!(Start::decide(Some(15), None), Start::Ahead(15));
        assert_eq!(Start::decide(Some(4), Some(10)), Start::Behind(6));
        assert_eq!(Start::decide(None, Some(10)), Start::Beginning);
        assert_eq!(Start::decide(None, None), Start::New);
    }
}

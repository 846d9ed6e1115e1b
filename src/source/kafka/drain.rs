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
//! `ListOffsets` for the ends), so it works with any Kafka-protocol broker. With offsets in the
//! database, a partition's position there is the one that counts ([`StoredPositions`], ahead of
//! Kafka's or behind it): it is committed with the records it follows, so the topic is done even
//! while Kafka's offset commits fail, and not done while the database lacks records that Kafka's
//! committed offset covers (a restore, a failover).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;

/// The group's positions kept outside Kafka (offsets in the database) of one topic, by
/// partition: the next offset to read.
pub(crate) type StoredPositions =
    Arc<dyn Fn(Arc<str>) -> BoxFuture<'static, Result<HashMap<i32, i64>, String>> + Send + Sync>;

/// Longest wait for one broker request of the check.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where one partition stands for the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionEnd {
    /// The topic.
    pub topic: Arc<str>,
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
    /// is at the end, or nothing was ever committed and the broker keeps no record. An offset
    /// past the end is not done: it belongs to another log (a topic deleted and re-created, a
    /// truncated log), and the consumer starts again from the log's start.
    pub(crate) fn is_done(&self) -> bool {
        match self.committed {
            Some(c) => c == self.high,
            None => self.low >= self.high,
        }
    }
}

/// Replaces each partition's committed offset by its position in the database, ahead of
/// Kafka's or behind it (`ends` and `stored` of one topic): the database says what was applied,
/// and the processor starts from there. A partition without a row of a topic the database knows
/// has nothing committed; a topic the database has never seen keeps Kafka's offsets.
pub(crate) fn merge_stored(ends: &mut [PartitionEnd], stored: &HashMap<i32, i64>) {
    if stored.is_empty() {
        return;
    }
    for end in ends {
        end.committed = stored.get(&end.partition).copied();
    }
}

/// The partitions not yet done, as `p<partition>: <committed>/<end>` for a log line (with
/// `<topic>/` in front when there are several topics); empty when every topic is done. A topic
/// without any partition known is not done.
pub(crate) fn pending(topics: &[Arc<str>], ends: &[PartitionEnd]) -> Option<Vec<String>> {
    let unknown: Vec<String> = topics
        .iter()
        .filter(|t| !ends.iter().any(|e| e.topic == **t))
        .map(|t| match topics.len() {
            1 => "no partition known yet".to_owned(),
            _ => format!("{t}: no partition known yet"),
        })
        .collect();
    if !unknown.is_empty() {
        return Some(unknown);
    }
    let prefix = |e: &PartitionEnd| match topics.len() {
        1 => String::new(),
        _ => format!("{}/", e.topic),
    };
    let left: Vec<String> = ends
        .iter()
        .filter(|e| !e.is_done())
        .map(|e| match e.committed {
            Some(c) if c > e.high => format!(
                "{}p{}: {c}/{} (committed past the end: an offset of another log)",
                prefix(e),
                e.partition,
                e.high
            ),
            Some(c) => format!("{}p{}: {c}/{}", prefix(e), e.partition, e.high),
            None => format!("{}p{}: none/{}", prefix(e), e.partition, e.high),
        })
        .collect();
    (!left.is_empty()).then_some(left)
}

/// Reads, for `group` (the consumer's own), the committed offset and the ends of every partition
/// of `topic`. Blocking: run it off the async threads.
pub(crate) fn partition_ends<C: Consumer<X>, X: ConsumerContext>(
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
            topic: Arc::from(topic),
            partition,
            committed,
            low,
            high,
        });
    }
    Ok(ends)
}

/// [`partition_ends`] of every topic of `topics`, in order.
fn all_ends<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    topics: &[Arc<str>],
) -> KafkaResult<Vec<PartitionEnd>> {
    let mut ends = Vec::new();
    for topic in topics {
        ends.extend(partition_ends(consumer, topic)?);
    }
    Ok(ends)
}

/// What one check found: the topics checked and every partition's end.
type CheckResult = Result<(Arc<[Arc<str>]>, Vec<PartitionEnd>), String>;

/// The group-wide end-of-topic check, run at most every 250 ms while this member's
/// partitions are at their end; the broker requests run off the async threads.
pub(crate) struct DrainWatch {
    stored: Option<StoredPositions>,
    running: Option<JoinHandle<CheckResult>>,
    last_start: Option<tokio::time::Instant>,
    last_pending: Option<Vec<String>>,
}

impl DrainWatch {
    const EVERY: Duration = Duration::from_millis(250);

    /// A watch that also counts the positions `stored` reads (offsets in the database).
    pub(crate) fn new(stored: Option<StoredPositions>) -> Self {
        Self {
            stored,
            running: None,
            last_start: None,
            last_pending: None,
        }
    }

    /// Starts a check of `topics` through `consumer`, unless one runs or ran a moment ago.
    pub(crate) fn start<C, X>(&mut self, consumer: &Arc<C>, topics: &Arc<[Arc<str>]>)
    where
        C: Consumer<X> + Send + Sync + 'static,
        X: ConsumerContext + 'static,
    {
        let now = tokio::time::Instant::now();
        if self.running.is_some() || self.last_start.is_some_and(|t| now - t < Self::EVERY) {
            return;
        }
        self.last_start = Some(now);
        let (consumer, stored) = (consumer.clone(), self.stored.clone());
        let topics = topics.clone();
        self.running = Some(tokio::spawn(async move {
            let names = topics.clone();
            let kafka = tokio::task::spawn_blocking(move || {
                // This member's own drained partitions count at once, not at the next
                // auto-commit. Nothing stored since the last commit is not a failure.
                match consumer.commit_consumer_state(CommitMode::Sync) {
                    Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                    Err(e) => tracing::debug!("offset commit before the drain check: {e}"),
                }
                all_ends(consumer.as_ref(), &names)
            });
            let mut ends = kafka
                .await
                .map_err(|e| format!("the check failed: {e}"))?
                .map_err(|e| format!("cannot read the group's offsets: {e}"))?;
            if let Some(stored) = stored {
                for topic in topics.iter() {
                    let positions = stored(topic.clone()).await.map_err(|e| {
                        format!("cannot read the group's offsets in the database: {e}")
                    })?;
                    let (mut of_topic, rest): (Vec<_>, Vec<_>) =
                        ends.into_iter().partition(|e| e.topic == *topic);
                    merge_stored(&mut of_topic, &positions);
                    ends = rest.into_iter().chain(of_topic).collect();
                }
            }
            Ok((topics, ends))
        }));
    }

    /// Resolves when a running check of `watch` ends: true when the whole topic is committed by
    /// the group. Pending forever while no check runs (or without a watch).
    pub(crate) async fn outcome_of(watch: &mut Option<DrainWatch>) -> bool {
        match watch {
            Some(w) => w.outcome().await,
            None => std::future::pending().await,
        }
    }

    async fn outcome(&mut self) -> bool {
        let Some(running) = self.running.as_mut() else {
            return std::future::pending().await;
        };
        let result = running.await;
        self.running = None;
        let pending = match result {
            Ok(Ok((topics, ends))) => pending(&topics, &ends),
            Ok(Err(e)) => Some(vec![e]),
            Err(e) => Some(vec![format!("the check failed: {e}")]),
        };
        if pending.is_some() && pending != self.last_pending {
            let left = pending.as_deref().unwrap_or_default().join(", ");
            tracing::info!(
                "this member's partitions are drained; waiting for the group to commit the rest \
                 of the topic: {left}"
            );
        }
        self.last_pending = pending;
        self.last_pending.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(partition: i32, committed: Option<i64>, low: i64, high: i64) -> PartitionEnd {
        PartitionEnd {
            topic: Arc::from("t"),
            partition,
            committed,
            low,
            high,
        }
    }

    #[test]
    fn a_partition_is_done_when_the_group_committed_its_end() {
        assert!(end(0, Some(10), 0, 10).is_done());
        assert!(
            !end(0, Some(11), 0, 10).is_done(),
            "past the end: another log's offset"
        );
        assert!(!end(0, Some(9), 0, 10).is_done());
        assert!(!end(0, None, 0, 10).is_done(), "records, nothing committed");
        assert!(end(0, None, 0, 0).is_done(), "an empty partition");
        assert!(end(0, None, 7, 7).is_done(), "every record expired");
    }

    #[test]
    fn the_topic_is_done_only_when_every_partition_is() {
        let half = [end(0, Some(10), 0, 10), end(1, Some(3), 0, 8)];
        let t: [Arc<str>; 1] = [Arc::from("t")];
        assert_eq!(pending(&t, &half), Some(vec!["p1: 3/8".to_owned()]));
        let none = [end(0, Some(10), 0, 10), end(1, None, 0, 8)];
        assert_eq!(pending(&t, &none), Some(vec!["p1: none/8".to_owned()]));
        let all = [end(0, Some(10), 0, 10), end(1, Some(8), 0, 8)];
        assert_eq!(pending(&t, &all), None);
        assert!(pending(&t, &[]).is_some(), "no metadata is not done");
        let two: [Arc<str>; 2] = [Arc::from("t"), Arc::from("u")];
        assert_eq!(
            pending(&two, &all),
            Some(vec!["u: no partition known yet".to_owned()]),
            "every topic counts"
        );
        let mut both = all.to_vec();
        both.push(PartitionEnd {
            topic: Arc::from("u"),
            ..end(0, Some(1), 0, 2)
        });
        assert_eq!(pending(&two, &both), Some(vec!["u/p0: 1/2".to_owned()]));
    }

    #[test]
    fn the_position_stored_in_the_database_wins_in_both_directions() {
        let mut ends = [
            end(0, Some(4), 0, 10),
            end(1, None, 0, 8),
            end(2, Some(9), 0, 9),
            end(3, Some(5), 0, 5),
        ];
        merge_stored(&mut ends, &HashMap::from([(0, 10), (1, 8), (2, 3)]));
        assert_eq!(
            ends.clone().map(|e| e.committed),
            [Some(10), Some(8), Some(3), None],
            "the database's, ahead or behind; none for a partition it holds no row of"
        );
        assert_eq!(
            pending(&[Arc::from("t")], &ends),
            Some(vec!["p2: 3/9".to_owned(), "p3: none/5".to_owned()])
        );
        let mut unknown = [end(0, Some(4), 0, 10)];
        merge_stored(&mut unknown, &HashMap::new());
        assert_eq!(
            unknown[0].committed,
            Some(4),
            "a topic the database never saw"
        );
    }
}

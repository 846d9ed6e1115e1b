//! Setting a consumer group's positions in the database: a deliberate skip or rewind, or a loss
//! accepted (`batch-inbox positions set`).
//!
//! Invariant: the database is the system of record, positions included, so an operator moves a
//! group through the database, never through Kafka's committed offsets (which a processor only
//! follows). A new position is always inside the partition's log (between its start and its end,
//! as the broker reports them now), and every change is recorded in `consumer_offset_changes`
//! (from where, to where, what was asked and why) in the transaction that makes it. A running
//! processor follows within seconds: its next offset write, or its idle check, finds the new
//! position and moves the partition there.

use std::time::Duration;

use deadpool_postgres::Pool;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::one_line_error;
use crate::source::kafka::consumer::KafkaSettings;

/// Longest wait for one broker request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where to move the positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PositionTarget {
    /// This offset of each partition.
    Offset(i64),
    /// The first record each partition still holds.
    Earliest,
    /// The end of each partition: everything before it skipped.
    Latest,
    /// The first record at or after this time (Unix milliseconds, the records' timestamps), or
    /// the end when there is none.
    Time(i64),
}

impl std::fmt::Display for PositionTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PositionTarget::Offset(o) => write!(f, "--to-offset {o}"),
            PositionTarget::Earliest => f.write_str("--to-earliest"),
            PositionTarget::Latest => f.write_str("--to-latest"),
            PositionTarget::Time(ms) => write!(f, "--to-time {ms}"),
        }
    }
}

/// One partition's move.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PositionChange {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The group's position in the database now (`None`: no row).
    pub from: Option<i64>,
    /// The new position.
    pub to: i64,
    /// The partition's first offset the broker still holds.
    pub log_start: i64,
    /// The partition's end.
    pub log_end: i64,
}

/// Why positions could not be planned or set.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PositionsError {
    /// The broker could not tell the partitions or their offsets.
    #[error("kafka: {0}")]
    Kafka(String),
    /// The database failed.
    #[error("database: {0}")]
    Db(String),
    /// The topic has none of the partitions asked for.
    #[error("topic {topic} has no partition {partition}")]
    NoPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: i32,
    },
    /// The offset asked for is outside the partition's log.
    #[error(
        "offset {offset} is outside partition {partition}'s log ({log_start}..={log_end}): \
         before its start the records are deleted, past its end there is nothing"
    )]
    OutOfRange {
        /// The partition.
        partition: i32,
        /// The offset asked for.
        offset: i64,
        /// The partition's first offset.
        log_start: i64,
        /// The partition's end.
        log_end: i64,
    },
}

impl From<tokio_postgres::Error> for PositionsError {
    fn from(e: tokio_postgres::Error) -> Self {
        PositionsError::Db(one_line_error(&e))
    }
}

impl From<deadpool_postgres::PoolError> for PositionsError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        PositionsError::Db(one_line_error(&e))
    }
}

/// The moves that would set `partitions` of `topic` (all of them when empty) to `target` for
/// the group of `kafka`, against the broker's logs now and the database's positions.
pub async fn plan(
    kafka: &KafkaSettings,
    pool: &Pool,
    topic: &str,
    partitions: &[i32],
    target: PositionTarget,
) -> Result<Vec<PositionChange>, PositionsError> {
    let config = kafka.client_config();
    let (topic_owned, wanted) = (topic.to_owned(), partitions.to_vec());
    let logs = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config
            .create()
            .map_err(|e| PositionsError::Kafka(e.to_string()))?;
        logs(&consumer, &topic_owned, &wanted, target)
    })
    .await
    .map_err(|e| PositionsError::Kafka(e.to_string()))??;
    let ids: Vec<i32> = logs.iter().map(|l| l.0).collect();
    let stored = crate::source::positions::read(pool, &kafka.group, topic, &ids)
        .await
        .map_err(|e| PositionsError::Db(e.to_string()))?;
    Ok(logs
        .into_iter()
        .map(|(partition, log_start, log_end, to)| PositionChange {
            topic: topic.to_owned(),
            partition,
            from: stored.get(&partition).copied(),
            to,
            log_start,
            log_end,
        })
        .collect())
}

/// Each partition's (id, log start, log end, new position). Blocking.
fn logs(
    consumer: &BaseConsumer,
    topic: &str,
    wanted: &[i32],
    target: PositionTarget,
) -> Result<Vec<(i32, i64, i64, i64)>, PositionsError> {
    let kafka = |e: rdkafka::error::KafkaError| PositionsError::Kafka(e.to_string());
    let metadata = consumer
        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
        .map_err(kafka)?;
    let mut all: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    all.sort_unstable();
    if let Some(&missing) = wanted.iter().find(|p| !all.contains(p)) {
        return Err(PositionsError::NoPartition {
            topic: topic.to_owned(),
            partition: missing,
        });
    }
    let chosen: Vec<i32> = match wanted.is_empty() {
        true => all,
        false => wanted.to_vec(),
    };
    let by_time = match target {
        PositionTarget::Time(ms) => {
            let mut tpl = TopicPartitionList::new();
            for p in &chosen {
                tpl.add_partition_offset(topic, *p, Offset::Offset(ms))
                    .map_err(kafka)?;
            }
            Some(
                consumer
                    .offsets_for_times(tpl, REQUEST_TIMEOUT)
                    .map_err(kafka)?,
            )
        }
        _ => None,
    };
    let mut out = Vec::with_capacity(chosen.len());
    for partition in chosen {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
            .map_err(kafka)?;
        let to = match target {
            PositionTarget::Offset(offset) if offset < low || offset > high => {
                return Err(PositionsError::OutOfRange {
                    partition,
                    offset,
                    log_start: low,
                    log_end: high,
                })
            }
            PositionTarget::Offset(offset) => offset,
            PositionTarget::Earliest => low,
            PositionTarget::Latest => high,
            PositionTarget::Time(_) => {
                let found = by_time
                    .as_ref()
                    .and_then(|t| t.find_partition(topic, partition))
                    .map(|e| e.offset());
                match found {
                    Some(Offset::Offset(o)) => o.clamp(low, high),
                    _ => high,
                }
            }
        };
        out.push((partition, low, high, to));
    }
    Ok(out)
}

/// Sets `changes` for `group` in one transaction, each recorded in `consumer_offset_changes`
/// with what was asked (`target`) and `reason`.
pub async fn apply(
    pool: &Pool,
    group: &str,
    changes: &[PositionChange],
    target: PositionTarget,
    reason: &str,
) -> Result<(), PositionsError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let asked = target.to_string();
    for c in changes {
        tx.execute(SET_POSITION, &[&group, &c.topic, &c.partition, &c.to])
            .await?;
        tx.execute(
            RECORD_CHANGE,
            &[
                &group,
                &c.topic,
                &c.partition,
                &c.from,
                &c.to,
                &asked,
                &reason,
            ],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The moves as a table for a terminal.
pub fn table(changes: &[PositionChange]) -> String {
    let mut out = format!(
        "{:<30} {:>9} {:>12} {:>12} {:>12} {:>12}\n",
        "topic", "partition", "database", "new", "log start", "log end"
    );
    for c in changes {
        let from = c.from.map_or_else(|| "none".to_owned(), |f| f.to_string());
        out.push_str(&format!(
            "{:<30} {:>9} {:>12} {:>12} {:>12} {:>12}\n",
            c.topic, c.partition, from, c.to, c.log_start, c.log_end
        ));
    }
    out
}

/// An operator's move of one partition's position (unconditional: it is the operator's).
const SET_POSITION: &str = "\
INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, updated_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at";

/// The record of one move.
const RECORD_CHANGE: &str = "\
INSERT INTO consumer_offset_changes (group_id, topic, partition, from_offset, to_offset, target, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)";

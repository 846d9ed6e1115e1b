//! The Kafka source: the group member and its partition queues (`consumer`), where an assigned
//! partition starts (`resume`: the database's position), the topic ids that tie the stored
//! positions to one topic (`topic_id`), and when `--exit-on-eof` may exit (`drain`).
//!
//! Invariant: offsets are stored for Kafka only after the COMMIT that covers them, and an
//! assigned partition starts at the database's position when the database holds one.

pub(crate) mod consumer;
pub(crate) mod drain;
pub(crate) mod resume;
pub(crate) mod topic_id;

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::error::RunError;
use crate::observe::stats::Stats;
use crate::source::{positions, OffsetSink, Partitions, Source};
use consumer::{queue_input, GroupMember, KafkaConsumer, KafkaSettings, Spawner, WorkerHandle};
use drain::{DrainWatch, StoredPositions};

/// A Kafka consumer group member as a [`Source`]. Its settings were checked
/// ([`KafkaSettings::check`]) before it is built.
pub(crate) struct KafkaSource {
    /// The client's settings (brokers, topics, group, librdkafka properties).
    pub settings: KafkaSettings,
    /// How long a revoke waits for a partition's in-flight batch.
    pub revoke_timeout: Duration,
    /// Positions are also in the database (`consumer_offsets`): an assigned partition starts
    /// there, and `--exit-on-eof` counts them.
    pub offsets_in_db: bool,
    /// Return once every partition of the topics is committed to its end by the group.
    pub exit_on_eof: bool,
    /// The database the positions are read from.
    pub pool: Pool,
    /// What the run counts.
    pub stats: Arc<Stats>,
}

impl Source for KafkaSource {
    async fn run(
        self,
        partitions: Arc<dyn Partitions>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let Self {
            settings,
            revoke_timeout,
            offsets_in_db,
            exit_on_eof,
            pool,
            stats,
        } = self;
        let (fail_tx, mut fail_rx) = mpsc::unbounded_channel();
        let on_assign = offsets_in_db.then(|| {
            let group = Arc::from(settings.group.as_str());
            resume::from_database(pool.clone(), group, stats.clone(), fail_tx.clone())
        });
        let observed = stats.clone();
        let spawn = |consumer| spawner(consumer, partitions, observed, fail_tx);
        let member = GroupMember::new(&settings, revoke_timeout, stats.clone(), spawn, on_assign)?;
        if offsets_in_db {
            let group = settings.group.as_str();
            resume::check_at_start(member.native_client(), &settings.topics, &pool, group)?;
        }
        let observed = stats.clone();
        member.on_statistics(Box::new(move |s| observed.telemetry.record_statistics(s)));
        let drain = exit_on_eof.then(|| {
            let stored = offsets_in_db.then(|| stored_positions(pool.clone(), &settings));
            DrainWatch::new(stored)
        });
        let result = member.poll_until(shutdown, &mut fail_rx, drain).await;
        member.shutdown().await;
        result
    }
}

/// The group's positions in the database, for the `--exit-on-eof` check.
fn stored_positions(pool: Pool, kafka: &KafkaSettings) -> StoredPositions {
    let group: Arc<str> = Arc::from(kafka.group.as_str());
    Arc::new(move |topic: Arc<str>| {
        let (pool, group) = (pool.clone(), group.clone());
        Box::pin(async move {
            positions::read_topic(&pool, &group, &topic)
                .await
                .map_err(|e| e.to_string())
        })
    })
}

/// Starts a run of `partitions` for each assigned partition, fed by its split queue; a run's
/// failure goes to `failures`, which stops the member.
fn spawner(
    consumer: Weak<KafkaConsumer>,
    partitions: Arc<dyn Partitions>,
    stats: Arc<Stats>,
    failures: mpsc::UnboundedSender<RunError>,
) -> Spawner {
    let ack: Arc<dyn OffsetSink> = Arc::new(GroupMember::offsets(consumer));
    Box::new(move |topic, partition, start, queue| {
        let run = partitions.start(topic.clone(), partition, start, ack.clone());
        let (stop, at_eof) = (run.stop, run.at_eof);
        let (stats, failures) = (stats.clone(), failures.clone());
        let body = run.run;
        let join = tokio::spawn(async move {
            let input = queue_input(topic, partition, &queue, stats).boxed();
            if let Err(e) = body.run(input).await {
                let _ = failures.send(e);
            }
        });
        WorkerHandle { stop, at_eof, join }
    })
}

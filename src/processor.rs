//! Wiring: a group member, an inbox and one worker per assigned partition.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::consumer::{
    queue_input, GroupContext, GroupMember, KafkaConsumer, KafkaSettings, Spawner, WorkerHandle,
};
use crate::error::RunError;
use crate::handler::Handler;
use crate::inbox::Inbox;
use crate::resume;
use crate::stats::Stats;
use crate::worker::{PartitionWorker, WorkerSettings};

/// Everything a processor needs besides the database pool and the handler.
#[derive(Debug, Clone)]
pub struct ProcessorConfig {
    /// Kafka client settings.
    pub kafka: KafkaSettings,
    /// Batching, mode and retries.
    pub worker: WorkerSettings,
    /// Header carrying the message id.
    pub id_header: String,
    /// Return once every assigned partition is at its end and committed.
    pub exit_on_eof: bool,
    /// Return once this many records are committed (for fixed-rate measurements).
    pub exit_after_records: Option<u64>,
    /// How long a revoke waits for a partition's in-flight batch.
    pub revoke_timeout: Duration,
    /// Each batch's transaction also stores the partition's next offset in `consumer_offsets`,
    /// and an assigned partition starts there when it is ahead of Kafka's committed offset.
    pub offsets_in_db: bool,
}

/// Consumes `config.kafka.topic` and applies it with `handler` until `shutdown` resolves (or,
/// with `exit_on_eof`, the topic is drained). Returns the totals.
pub async fn run<H: Handler>(
    config: ProcessorConfig,
    pool: Pool,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
) -> Result<Arc<Stats>, RunError> {
    let stats = Arc::new(Stats::default());
    run_with_stats(config, pool, handler, stats.clone(), shutdown).await?;
    Ok(stats)
}

/// [`run`], counting into `stats`, which the caller can read while it runs.
pub async fn run_with_stats<H: Handler>(
    config: ProcessorConfig,
    pool: Pool,
    handler: Arc<H>,
    stats: Arc<Stats>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    warn_unsafe(&config.worker);
    let inbox = Arc::new(
        Inbox::new(pool.clone(), handler, config.id_header.as_str())
            .with_unsafe_no_inbox(config.worker.unsafe_no_inbox)
            .with_offsets_in_db(config.offsets_in_db.then_some(config.kafka.group.as_str())),
    );
    let on_assign = config.offsets_in_db.then(|| {
        let group = Arc::from(config.kafka.group.as_str());
        resume::from_database(pool.clone(), group, stats.clone())
    });
    let (fail_tx, mut fail_rx) = mpsc::unbounded_channel();
    let spawn = |consumer| spawner(consumer, inbox, config.worker, stats.clone(), fail_tx);
    let member = GroupMember::new(&config.kafka, config.revoke_timeout, spawn, on_assign)?;
    let (exit_on_eof, limit) = (config.exit_on_eof, config.exit_after_records);
    let counted = stats.clone();
    let finished = move |group: &GroupContext| {
        let records = counted.records.load(std::sync::atomic::Ordering::Relaxed);
        (exit_on_eof && group.all_at_eof()) || limit.is_some_and(|n| records >= n)
    };
    let result = member.poll_until(shutdown, &mut fail_rx, finished).await;
    member.shutdown().await;
    result
}

/// The unsafe controls exist for fault tests only: say so loudly.
fn warn_unsafe(settings: &WorkerSettings) {
    if settings.unsafe_offsets_before_commit {
        tracing::warn!(
            "UNSAFE: --unsafe-offsets-before-commit is set: offsets are stored BEFORE the database \
             commit, so crashes and failures LOSE messages. Test-only control; never use it in production."
        );
    }
    if settings.unsafe_no_inbox {
        tracing::warn!(
            "UNSAFE: --unsafe-no-inbox is set: no deduplication, redelivered messages are APPLIED \
             TWICE. Test-only control; never use it in production."
        );
    }
}

fn spawner<H: Handler>(
    consumer: Weak<KafkaConsumer>,
    inbox: Arc<Inbox<H>>,
    settings: WorkerSettings,
    stats: Arc<Stats>,
    failures: mpsc::UnboundedSender<RunError>,
) -> Spawner {
    let sink = Arc::new(GroupMember::offsets(consumer));
    Box::new(move |topic, partition, queue| {
        let stop = CancellationToken::new();
        let at_eof = Arc::new(AtomicBool::new(false));
        let worker = PartitionWorker::new(
            topic.clone(),
            partition,
            inbox.clone(),
            sink.clone(),
            settings,
            stats.clone(),
            at_eof.clone(),
        );
        let failures = failures.clone();
        let token = stop.clone();
        let join = tokio::spawn(async move {
            if let Err(e) = worker.run(queue_input(topic, &queue), token).await {
                tracing::error!(partition, "partition worker stopped: {e}");
                let _ = failures.send(e);
            }
        });
        WorkerHandle { stop, at_eof, join }
    })
}

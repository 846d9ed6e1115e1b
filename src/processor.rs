//! Wiring: a group member, an inbox and one worker per assigned partition.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
use crate::observe::stats::Stats;
use crate::pipeline::handler::Handler;
use crate::pipeline::inbox::Inbox;
use crate::pipeline::message::Decoding;
use crate::pipeline::worker::{PartitionWorker, WorkerSettings};
use crate::source::kafka::consumer::{
    queue_input, GroupMember, KafkaConsumer, KafkaSettings, Spawner, WorkerHandle,
};
use crate::source::kafka::drain::{DrainWatch, StoredPositions};
use crate::source::kafka::resume;

/// Everything a processor needs besides the database pool and the handler.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProcessorConfig {
    /// Kafka client settings.
    pub kafka: KafkaSettings,
    /// Batching, mode and retries.
    pub worker: WorkerSettings,
    /// How records are decoded: where ids come from (by default the UUID of header `id`),
    /// which are accepted, what tombstones and values are.
    pub decoding: Decoding,
    /// Return once every partition of the topic is committed to its end by the group (this
    /// member's and the others'; see module `drain`).
    pub exit_on_eof: bool,
    /// How long a revoke waits for a partition's in-flight batch.
    pub revoke_timeout: Duration,
    /// The dedup-window guard: UUIDv7 ids older than this are dead-lettered, not applied.
    pub dedup_window: Option<Duration>,
    /// The statement timeout of the pool's connections ([`crate::db::ConnectOptions`]): a
    /// transaction that gets no answer within twice this is given up and its connection
    /// dropped (`None`: no deadline).
    pub statement_timeout: Option<Duration>,
    /// Each batch's transaction also stores the partition's next offset in `consumer_offsets`,
    /// and an assigned partition starts there when it is ahead of Kafka's committed offset.
    pub offsets_in_db: bool,
}

impl ProcessorConfig {
    /// The product's defaults (module `defaults`, the command line's too) for `kafka`: batched,
    /// natural batching of at most 1000 records or 4 MiB, header `id`, offsets also in the
    /// database, a 30 s statement timeout, run until shut down.
    pub fn new(kafka: KafkaSettings) -> Self {
        use crate::pipeline::defaults;
        Self {
            kafka,
            worker: WorkerSettings::default(),
            decoding: Decoding::default(),
            exit_on_eof: false,
            revoke_timeout: defaults::REVOKE_TIMEOUT,
            offsets_in_db: defaults::OFFSETS_IN_DB,
            dedup_window: None,
            statement_timeout: Some(defaults::STATEMENT_TIMEOUT),
        }
    }

    /// Returns once the whole topic is committed to its end by the group (`--exit-on-eof`).
    pub fn until_drained(mut self) -> Self {
        self.exit_on_eof = true;
        self.kafka.partition_eof = true;
        self
    }
}

/// Consumes `config.kafka.topics` and applies them with `handler` until `shutdown` resolves (or,
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
    config.kafka.check(config.offsets_in_db)?;
    config.worker.unsafe_controls.warn();
    stats.telemetry.declare_reasons(H::REJECTIONS);
    stats
        .telemetry
        .set_unsafe_mode(&config.worker.unsafe_controls.switches());
    let inbox = Arc::new(
        Inbox::new(pool.clone(), handler, config.decoding.ids.header.as_str())
            .with_decoding(config.decoding.clone())
            .with_unsafe_controls(config.worker.unsafe_controls)
            .with_offsets_in_db(config.offsets_in_db.then_some(config.kafka.group.as_str()))
            .with_dedup_window(config.dedup_window)
            .with_statement_timeout(config.statement_timeout),
    );
    let (fail_tx, mut fail_rx) = mpsc::unbounded_channel();
    let on_assign = config.offsets_in_db.then(|| {
        let group = Arc::from(config.kafka.group.as_str());
        resume::from_database(pool.clone(), group, stats.clone(), fail_tx.clone())
    });
    let spawn = |consumer| spawner(consumer, inbox, config.worker, stats.clone(), fail_tx);
    let member = GroupMember::new(
        &config.kafka,
        config.revoke_timeout,
        stats.clone(),
        spawn,
        on_assign,
    )?;
    if config.offsets_in_db {
        let group = config.kafka.group.as_str();
        resume::check_at_start(member.native_client(), &config.kafka.topics, &pool, group)?;
    }
    let observed = stats.clone();
    member.on_statistics(Box::new(move |s| observed.telemetry.record_statistics(s)));
    let drain = config.exit_on_eof.then(|| {
        let stored = config
            .offsets_in_db
            .then(|| stored_positions(pool.clone(), &config.kafka));
        DrainWatch::new(stored)
    });
    let result = member.poll_until(shutdown, &mut fail_rx, drain).await;
    member.shutdown().await;
    result
}

/// The group's offsets in the database, for the `--exit-on-eof` check.
fn stored_positions(pool: Pool, kafka: &KafkaSettings) -> StoredPositions {
    let group: Arc<str> = Arc::from(kafka.group.as_str());
    Arc::new(move |topic: Arc<str>| {
        let (pool, group) = (pool.clone(), group.clone());
        Box::pin(async move {
            crate::pipeline::positions::read_topic(&pool, &group, &topic)
                .await
                .map_err(|e| e.to_string())
        })
    })
}

fn spawner<H: Handler>(
    consumer: Weak<KafkaConsumer>,
    inbox: Arc<Inbox<H>>,
    settings: WorkerSettings,
    stats: Arc<Stats>,
    failures: mpsc::UnboundedSender<RunError>,
) -> Spawner {
    let sink = Arc::new(GroupMember::offsets(consumer));
    Box::new(move |topic, partition, start, queue| {
        // Each offset write compares against the position the assignment started from.
        inbox.hold_position(&topic, partition, start);
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
        let assigned = stats.telemetry.partition_assigned();
        let observed = stats.clone();
        let join = tokio::spawn(async move {
            let _assigned = assigned;
            let input = queue_input(topic.clone(), partition, &queue, observed.clone());
            let run = AssertUnwindSafe(worker.run(input, token));
            let result = run.catch_unwind().await.unwrap_or_else(|panic| {
                Err(RunError::WorkerPanic {
                    topic: topic.to_string(),
                    partition,
                    message: panic_message(panic.as_ref()),
                })
            });
            // A partition given up (revoked, stopping) is no longer this member's stall.
            observed.telemetry.stalls.resumed(&topic, partition);
            if let Err(e) = result {
                tracing::error!(partition, "partition worker stopped: {e}");
                let _ = failures.send(e);
            }
        });
        WorkerHandle { stop, at_eof, join }
    })
}

/// The text of a panic's payload (`panic!` with a literal or a formatted message).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

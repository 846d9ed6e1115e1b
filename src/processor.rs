//! Wiring: a source (Kafka's group member), an inbox, and one worker per partition the source
//! starts (the pipeline's side of the seam, module `source`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
use crate::observe::stats::Stats;
use crate::observe::telemetry::GaugeGuard;
use crate::pipeline::handler::Handler;
use crate::pipeline::inbox::Inbox;
use crate::pipeline::message::Decoding;
use crate::pipeline::worker::{PartitionWorker, WorkerSettings};
use crate::source::amqp::{AmqpError, AmqpSettings, AmqpSource};
use crate::source::kafka::consumer::KafkaSettings;
use crate::source::kafka::KafkaSource;
use crate::source::nats::{NatsSettings, NatsSource};
use crate::source::{Input, OffsetSink, PartitionRun, Partitions, RunPartition, Source};

/// Everything a processor needs besides the database pool and the handler.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProcessorConfig {
    /// Kafka client settings (unused when [`Self::amqp`] is set).
    pub kafka: KafkaSettings,
    /// Read RabbitMQ queues instead of Kafka (`None`: Kafka).
    pub amqp: Option<AmqpSettings>,
    /// Read a NATS JetStream stream instead of Kafka (`None`: Kafka).
    pub nats: Option<NatsSettings>,
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
            amqp: None,
            nats: None,
            worker: WorkerSettings::default(),
            decoding: Decoding::default(),
            exit_on_eof: false,
            revoke_timeout: defaults::REVOKE_TIMEOUT,
            offsets_in_db: defaults::OFFSETS_IN_DB,
            dedup_window: None,
            statement_timeout: Some(defaults::STATEMENT_TIMEOUT),
        }
    }

    /// Refuses settings the source cannot keep the guarantee with (nothing is consumed): the
    /// Kafka consumer's ([`KafkaSettings::check`]), or the queues' ([`AmqpSettings::check`], and
    /// ids from positions, which a queue gives anew to each delivery).
    pub fn check(&self) -> Result<(), RunError> {
        if let Some(nats) = &self.nats {
            return Ok(nats.check(self.offsets_in_db)?);
        }
        let Some(amqp) = &self.amqp else {
            return Ok(self.kafka.check(self.offsets_in_db)?);
        };
        amqp.check(self.offsets_in_db)?;
        if self.decoding.ids.source == crate::pipeline::message::IdSource::Position {
            return Err(AmqpError::Settings(
                "--id-from position: a queue's record gets a new number each time it is \
                 delivered, so an id from it would apply a redelivery again; use the message_id \
                 property (--id-from key) or a header"
                    .to_owned(),
            )
            .into());
        }
        Ok(())
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
    // Refused settings end the run before anything else is set up.
    config.check()?;
    // Positions in the database are the reader's: Kafka's group id, the queues' reader name.
    let positions = config
        .offsets_in_db
        .then_some(match (&config.amqp, &config.nats) {
            (_, Some(nats)) => nats.consumer.as_str(),
            (Some(amqp), None) => amqp.reader.as_str(),
            (None, None) => config.kafka.group.as_str(),
        });
    // While the consumer joins its group: the connections the first batches will use, opened,
    // their statements prepared.
    let mut statements = handler.statements();
    statements.extend(
        crate::pipeline::inbox::STATEMENTS
            .iter()
            .map(|s| s.to_string()),
    );
    tokio::spawn(crate::db::warm(pool.clone(), statements));
    let workers = Workers::new(&config, positions, pool.clone(), handler, stats.clone());
    if let Some(mut settings) = config.nats {
        settings.batch_size = config.worker.batcher.max_items.get();
        let source = NatsSource {
            settings,
            exit_on_eof: config.exit_on_eof,
            pool,
            stats,
        };
        return source.run(workers, shutdown).await;
    }
    if let Some(settings) = config.amqp {
        let source = AmqpSource {
            settings,
            exit_on_eof: config.exit_on_eof,
            pool,
            stats,
        };
        return source.run(workers, shutdown).await;
    }
    let source = KafkaSource {
        settings: config.kafka,
        revoke_timeout: config.revoke_timeout,
        offsets_in_db: config.offsets_in_db,
        exit_on_eof: config.exit_on_eof,
        pool,
        stats,
    };
    source.run(workers, shutdown).await
}

/// The pipeline's side of the seam: a [`PartitionWorker`] for each partition a source starts.
struct Workers<H: Handler> {
    inbox: Arc<Inbox<H>>,
    settings: WorkerSettings,
    stats: Arc<Stats>,
}

impl<H: Handler> Workers<H> {
    /// The pipeline of `config` over `pool` with `handler`, counting into `stats`; each batch's
    /// transaction stores the partition's position under `positions` (the source's name for the
    /// reader: Kafka's group id), when given.
    fn new(
        config: &ProcessorConfig,
        positions: Option<&str>,
        pool: Pool,
        handler: Arc<H>,
        stats: Arc<Stats>,
    ) -> Arc<Self> {
        config.worker.unsafe_controls.warn();
        stats.telemetry.declare_reasons(H::REJECTIONS);
        stats
            .telemetry
            .set_unsafe_mode(&config.worker.unsafe_controls.switches());
        let inbox = Inbox::new(pool, handler, config.decoding.ids.header.as_str())
            .with_decoding(config.decoding.clone())
            .with_unsafe_controls(config.worker.unsafe_controls)
            .with_offsets_in_db(positions)
            .with_dedup_window(config.dedup_window)
            .with_statement_timeout(config.statement_timeout);
        Arc::new(Self {
            inbox: Arc::new(inbox),
            settings: config.worker,
            stats,
        })
    }
}

impl<H: Handler> Partitions for Workers<H> {
    fn start(
        &self,
        topic: Arc<str>,
        partition: i32,
        start: Option<i64>,
        ack: Arc<dyn OffsetSink>,
    ) -> PartitionRun {
        // Each offset write compares against the position the partition started from.
        self.inbox.hold_position(&topic, partition, start);
        let stop = CancellationToken::new();
        let at_eof = Arc::new(AtomicBool::new(false));
        let worker = PartitionWorker::new(
            topic.clone(),
            partition,
            self.inbox.clone(),
            ack,
            self.settings,
            self.stats.clone(),
            at_eof.clone(),
        );
        let run = Box::new(WorkerRun {
            worker,
            stop: stop.clone(),
            stats: self.stats.clone(),
            assigned: self.stats.telemetry.partition_assigned(),
            topic,
            partition,
        });
        PartitionRun { stop, at_eof, run }
    }
}

/// One partition's worker, until its source stops it.
struct WorkerRun<H: Handler> {
    worker: PartitionWorker<H, dyn OffsetSink>,
    stop: CancellationToken,
    stats: Arc<Stats>,
    /// Counts the partition as assigned while the run lives.
    assigned: GaugeGuard,
    topic: Arc<str>,
    partition: i32,
}

impl<H: Handler> RunPartition for WorkerRun<H> {
    fn run<'a>(
        self: Box<Self>,
        input: BoxStream<'a, Input>,
    ) -> BoxFuture<'a, Result<(), RunError>> {
        let Self {
            worker,
            stop,
            stats,
            assigned,
            topic,
            partition,
        } = *self;
        Box::pin(async move {
            let _assigned = assigned;
            let run = AssertUnwindSafe(worker.run(input, stop));
            let result = run.catch_unwind().await.unwrap_or_else(|panic| {
                Err(RunError::WorkerPanic {
                    topic: topic.to_string(),
                    partition,
                    message: panic_message(panic.as_ref()),
                })
            });
            // A partition given up (revoked, stopping) is no longer this member's stall.
            stats.telemetry.stalls.resumed(&topic, partition);
            if let Err(e) = &result {
                tracing::error!(partition, "partition worker stopped: {e}");
            }
            result
        })
    }
}

/// The text of a panic's payload (`panic!` with a literal or a formatted message).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests;

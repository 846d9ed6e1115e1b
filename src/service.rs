//! The processor as a service: what `batch-inbox run` does around the pipeline, for a service
//! that embeds the library with its own handler.
//!
//! In order: the database (the first connection, retried while the database cannot be reached,
//! then the schema and the role's grants, within the start-up timeout: [`Service::start`]); the
//! brokers (the probe: refused credentials, a failed handshake, a missing ACL or no broker end
//! the start with the cause); the inbox partitions prepared and the background retention; the
//! stats file, the HTTP listener (metrics and probes) and the summary log lines; then the
//! pipeline ([`crate::run_with_stats`]) until the shutdown future completes or the topic is
//! drained (`exit_on_eof`).
//!
//! Invariant: nothing is consumed before the database answered its start-up checks and the
//! brokers answered the probe; the retention task, the listener and the summary lines stop
//! after the pipeline did, and the stats file is written once more at the end.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;

use crate::db;
use crate::db::DbError;
use crate::error::{one_line_error, RunError};
use crate::maintenance::retention::{self, RetentionError, RetentionSettings};
use crate::observe::exporter::{self, ExporterError};
use crate::observe::stats::Stats;
use crate::observe::stats_file::{RunSettings, StatsFile};
use crate::observe::summary;
use crate::pipeline::handler::Handler;
use crate::processor::{run_with_stats, ProcessorConfig};
use crate::secret::DatabaseUrl;
use crate::source::kafka::consumer::KafkaStartupError;

/// Everything a service runs with besides its handler. [`ServiceConfig::new`] gives the
/// binary's defaults.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The pipeline's settings.
    pub processor: ProcessorConfig,
    /// The database; its password is never shown.
    pub database_url: DatabaseUrl,
    /// Connections of the pool.
    pub pool_size: usize,
    /// `statement_timeout` of each connection (zero: the server's).
    pub statement_timeout: Duration,
    /// How long the start may take: the database's first connection and checks, and the
    /// brokers' probe (zero: one attempt each, the probe bounded at 10 s).
    pub startup_timeout: Duration,
    /// What the role's grants are checked for at start.
    pub uses: Vec<db::Uses>,
    /// Inbox rows older than this are removed in the background (`None`: no cleanup here).
    pub retention: Option<Duration>,
    /// The dedup window guarded when the cleanup runs elsewhere (`None`: the retention's).
    pub dedup_window: Option<Duration>,
    /// How the cleanup deletes (its `retention` is set from [`Self::retention`]).
    pub cleanup: RetentionSettings,
    /// How often the background retention runs.
    pub cleanup_interval: Duration,
    /// Where the HTTP listener serves `/metrics`, `/healthz` and `/readyz` (`None`: none).
    pub metrics_addr: Option<SocketAddr>,
    /// One summary line this often (zero: none).
    pub log_interval: Duration,
    /// The stats file, rewritten every `stats_interval` and at the end (`None`: none).
    pub stats_file: Option<PathBuf>,
    /// How often the stats file is rewritten.
    pub stats_interval: Duration,
    /// The settings the stats file records.
    pub run_settings: RunSettings,
}

impl ServiceConfig {
    /// The binary's defaults around `processor`, connecting to `database_url`.
    pub fn new(processor: ProcessorConfig, database_url: DatabaseUrl) -> Self {
        Self {
            processor,
            database_url,
            pool_size: crate::pipeline::defaults::POOL_SIZE.get(),
            statement_timeout: crate::pipeline::defaults::STATEMENT_TIMEOUT,
            startup_timeout: Duration::from_secs(60),
            uses: vec![
                db::Uses::Inbox,
                db::Uses::PartitionUpkeep,
                db::Uses::OffsetsInDb,
            ],
            retention: None,
            dedup_window: None,
            cleanup: RetentionSettings::default(),
            cleanup_interval: Duration::from_secs(60),
            metrics_addr: None,
            log_interval: Duration::from_secs(10),
            stats_file: None,
            stats_interval: Duration::from_secs(1),
            run_settings: RunSettings::default(),
        }
    }
}

/// Why a service did not start, or stopped with an error. Each shows the cause's own message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The database refused or failed a start-up step.
    #[error(transparent)]
    Db(#[from] DbError),
    /// A pool connection failed.
    #[error(transparent)]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The start-up did not finish in time.
    #[error("{0}")]
    Startup(String),
    /// The brokers refused the probe.
    #[error(transparent)]
    Kafka(#[from] KafkaStartupError),
    /// RabbitMQ refused the start (the login, a queue's declaration) or could not be reached.
    #[error(transparent)]
    Amqp(#[from] crate::error::AmqpError),
    /// NATS JetStream refused the settings, the login, the stream or the consumer.
    #[error(transparent)]
    Nats(#[from] crate::error::NatsError),
    /// The inbox partitions could not be prepared.
    #[error(transparent)]
    Retention(#[from] RetentionError),
    /// The HTTP listener could not start.
    #[error(transparent)]
    Exporter(#[from] ExporterError),
    /// The pipeline stopped with an error.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A check of the caller's failed ([`Service::start`]).
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

/// A service whose database answered its start-up checks: [`Service::run`] runs it.
pub struct Service<T> {
    config: ServiceConfig,
    pool: Pool,
    /// What the caller's checks at start returned (a prepared statement, say).
    pub prepared: T,
}

impl Service<()> {
    /// Connects (retried while the database cannot be reached, within the start-up timeout),
    /// then, within the start-up timeout: runs `schema` (the caller's check of the tables its
    /// handler needs, e.g. [`db::check_schema`]), checks the role's grants for `config.uses`,
    /// and runs `prepare` (what the handler needs ready before anything is consumed: a
    /// statement prepared, say), whose result the service keeps as [`Service::prepared`]. Each
    /// failure is one line.
    pub async fn start<S, SFut, P, PFut, T, E1, E2>(
        config: ServiceConfig,
        schema: S,
        prepare: P,
    ) -> Result<Service<T>, ServiceError>
    where
        S: FnOnce(Pool) -> SFut,
        SFut: Future<Output = Result<(), E1>>,
        P: FnOnce(Pool) -> PFut,
        PFut: Future<Output = Result<T, E2>>,
        E1: Into<Box<dyn std::error::Error + Send + Sync>>,
        E2: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let within = config.startup_timeout;
        let deadline = tokio::time::Instant::now() + within;
        let options = db::ConnectOptions {
            statement_timeout: Some(config.statement_timeout).filter(|t| !t.is_zero()),
        };
        let url = config.database_url.expose();
        let pool = db::connect_within(url, config.pool_size, options, within)
            .await
            .map_err(|e| match e.is_transient() {
                true => ServiceError::Startup(format!(
                    "{} (still failing after --startup-timeout {within:?})",
                    one_line_error(&e)
                )),
                false => e.into(),
            })?;
        let checks = async {
            schema(pool.clone())
                .await
                .map_err(|e| ServiceError::Other(e.into()))?;
            db::check_grants(&pool, "run", &config.uses).await?;
            prepare(pool.clone())
                .await
                .map_err(|e| ServiceError::Other(e.into()))
        };
        let prepared = match within.is_zero() {
            true => checks.await?,
            false => tokio::time::timeout_at(deadline, checks)
                .await
                .map_err(|_| {
                    ServiceError::Startup(format!(
                        "the database did not answer the start-up checks (schema, grants) within \
                         --startup-timeout {within:?}"
                    ))
                })??,
        };
        Ok(Service {
            config,
            pool,
            prepared,
        })
    }
}

impl<T> Service<T> {
    /// The pool the service runs on.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Probes the brokers, starts the retention, the stats file, the listener and the summary
    /// lines, and runs `handler` until `shutdown` completes (or the topic is drained with
    /// `exit_on_eof`); counts into `stats` (from [`Stats::with_report`] when a stats file is
    /// written).
    pub async fn run<H: Handler>(
        &self,
        handler: Arc<H>,
        stats: Arc<Stats>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServiceError> {
        let config = &self.config;
        // Before anything is consumed: refused credentials, a failed handshake, a missing ACL or
        // no broker within the start-up timeout end the start here, with the cause.
        match (&config.processor.amqp, &config.processor.nats) {
            (_, Some(nats)) => {
                let mut nats = nats.clone();
                nats.batch_size = config.processor.worker.batcher.max_items.get();
                nats.probe(self.probe_time()).await?
            }
            (Some(amqp), None) => amqp.probe(self.probe_time()).await?,
            (None, None) => config.processor.kafka.probe(self.probe_time()).await?,
        }
        let maintenance = self.start_maintenance().await?;
        let stats_file = config.stats_file.clone().map(|path| {
            StatsFile::start(
                path,
                config.run_settings.clone(),
                stats.clone(),
                config.stats_interval,
            )
        });
        let result = self.process(handler, stats, shutdown).await;
        if let Some(m) = maintenance {
            m.stop.cancel();
            if let Err(e) = m.task.await {
                tracing::warn!("retention task: {e}");
            }
        }
        if let Some(file) = stats_file {
            if let Err(e) = file.finish().await {
                tracing::warn!("cannot write the stats file: {e}");
            }
        }
        result
    }

    /// How long the broker probe may take: the start-up timeout (zero: one attempt, bounded at
    /// 10 s). The database's part has its own; the probe's lines name the timeout as given.
    fn probe_time(&self) -> Duration {
        match self.config.startup_timeout.is_zero() {
            true => Duration::from_secs(10),
            false => self.config.startup_timeout,
        }
    }

    /// Prepares the partitions ahead before anything is consumed (partitioned inbox), then
    /// starts the background retention task when it has work: a cleanup (`retention`) or
    /// partitions to prepare day after day. Warns when the topic outlives the inbox retention.
    async fn start_maintenance(&self) -> Result<Option<Maintenance>, ServiceError> {
        let config = &self.config;
        let expire = config.retention.is_some();
        // A queue keeps a record until it is acknowledged: a redelivery is never older than the
        // oldest unacknowledged delivery, so only a topic's retention is compared.
        if let Some(window) = config.retention.or(config.dedup_window) {
            if config.processor.amqp.is_none() && config.processor.nats.is_none() {
                retention::topic::warn_if_topic_outlives(&config.processor.kafka, window).await;
            }
        }
        let layout = retention::partition::layout(&self.pool.get().await?).await?;
        if !expire && layout == retention::Layout::Plain {
            return Ok(None);
        }
        let mut settings = config.cleanup;
        settings.retention = config.retention.unwrap_or_default();
        let now = std::time::SystemTime::now();
        let (created, postponed) =
            retention::prepare_partitions(&self.pool, &settings, now).await?;
        if !created.is_empty() || !postponed.is_empty() {
            tracing::info!(?created, ?postponed, "inbox partitions prepared");
        }
        let stop = CancellationToken::new();
        let task = tokio::spawn(retention::maintain(
            self.pool.clone(),
            settings,
            expire,
            config.cleanup_interval,
            stop.clone(),
        ));
        Ok(Some(Maintenance { stop, task }))
    }

    /// Runs the pipeline with `handler`, with the listener and the summary lines beside it.
    async fn process<H: Handler>(
        &self,
        handler: Arc<H>,
        stats: Arc<Stats>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServiceError> {
        let config = &self.config;
        let stop = CancellationToken::new();
        let stop_ops = stop.clone().drop_guard();
        // Before the listener starts: no scrape of an unsafe run reads 0.
        stats.mark_unsafe(&config.processor.worker.unsafe_controls);
        if let Some(addr) = config.metrics_addr {
            let url = config.database_url.expose();
            exporter::start(addr, url, self.pool.clone(), stats.clone(), stop.clone()).await?;
        }
        let summary = summary::summary_loop(stats.clone(), config.log_interval, stop);
        let summary = tokio::spawn(summary);
        let result = run_with_stats(
            config.processor.clone(),
            self.pool.clone(),
            handler,
            stats,
            shutdown,
        )
        .await;
        drop(stop_ops); // the last summary line covers the run's end
        let _ = summary.await;
        Ok(result?)
    }
}

/// The background retention task, stopped when the pipeline stops.
struct Maintenance {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

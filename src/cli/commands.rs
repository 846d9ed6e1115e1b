//! The binary's commands and their flags (those shared with the tools are in `args`), checked
//! and converted into the library's types.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use batch_inbox::{
    AmqpSettings, AmqpUrl, KafkaSettings, NatsSettings, NatsUrl, ProcessorConfig, QueueType,
};

use batch_inbox::internals::{defaults, names::parse_interval};

use super::args::{DbArgs, KafkaArgs, PipelineArgs};
use super::dead_letters::DeadLettersArgs;
use super::handler::HandlerArgs;
use super::logging::LogFormat;
use super::positions::PositionsArgs;
use super::retention::{parse_retention, CleanupArgs, CleanupCommandArgs, MigrateArgs};

/// Apply a Kafka topic to PostgreSQL exactly once, with a micro-batched transactional inbox.
#[derive(Debug, Parser)]
#[command(name = "batch-inbox", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// TOML file of settings, keyed by long flag name (`[librdkafka]` table for -X); flags and
    /// environment variables take precedence over it.
    #[arg(long, global = true, env = "BATCH_INBOX_CONFIG", value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Log lines as human-readable text or as one JSON object per line.
    #[arg(
        long,
        global = true,
        env = "BATCH_INBOX_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the tables: the core's, and the ledger's unless --handler sql
    /// (idempotent, versioned by owner).
    Migrate(MigrateArgs),
    /// Remove inbox rows older than the retention, in small batches, and report what was removed.
    Cleanup(CleanupCommandArgs),
    /// Consume a topic and apply it to the database.
    Run(Box<RunArgs>),
    /// List dead letters, or re-drive them through the handler once their cause is fixed.
    DeadLetters(DeadLettersArgs),
    /// Move a consumer group's positions in the database, the system of record for them.
    Positions(PositionsArgs),
}

/// `run` flags.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: DbArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub kafka: KafkaArgs,
    /// How long start-up may take before the process exits 1 (`60s`, `2m`): the database is
    /// retried while it cannot be reached, then its schema and the role's grants are checked,
    /// then the brokers are probed (the topics' metadata, the group's committed offsets, a
    /// fetch). Refused credentials, a failed TLS handshake, a refused ACL or grant end it at
    /// once. `0`: one attempt of each (the broker probe's bounded at 10 s).
    #[arg(
        long,
        env = "BATCH_INBOX_STARTUP_TIMEOUT",
        default_value = defaults::STARTUP_TIMEOUT_FLAG,
        value_parser = parse_interval
    )]
    pub startup_timeout: Duration,
    /// Consumer group (on RabbitMQ: the reader's name, which the queues' positions in the
    /// database are kept under).
    #[arg(long, env = "BATCH_INBOX_GROUP", default_value = defaults::GROUP)]
    pub group: String,
    /// Read RabbitMQ or NATS JetStream instead of Kafka: the broker's URL,
    /// `amqp://user:password@host:5672/vhost` or `amqps://…` with --queue, or
    /// `nats://user:password@host:4222` (or `nats://token@host`) with --stream. Its password or
    /// token is never shown.
    #[arg(long, env = "BATCH_INBOX_SOURCE", value_name = "URL", value_parser = SourceParser)]
    pub source: Option<SourceUrl>,
    /// A JetStream stream to read (with --source nats://…; repeatable, or a comma list), each
    /// an ordered stream read through its durable pull consumer --consumer by one instance at a
    /// time.
    #[arg(
        long = "stream",
        env = "BATCH_INBOX_STREAM",
        value_name = "STREAM",
        value_delimiter = ','
    )]
    pub streams: Vec<String>,
    /// The durable pull consumer of --stream (default: --group), created when missing: ack
    /// policy all, max_deliver unlimited, max_ack_pending two batches. One instance reads it at a
    /// time (the others stand by); the stream sequence is kept in the database under its name.
    #[arg(long, env = "BATCH_INBOX_CONSUMER", value_name = "NAME")]
    pub consumer: Option<String>,
    /// The subject the consumer reads when it is created (default: the whole stream).
    #[arg(long, env = "BATCH_INBOX_FILTER_SUBJECT", value_name = "SUBJECT")]
    pub filter_subject: Option<String>,
    /// The consumer's ack_wait when it is created: a delivery unacknowledged this long is
    /// delivered again (held batches are kept in progress meanwhile). `30s`, `1m`.
    #[arg(
        long,
        env = "BATCH_INBOX_ACK_WAIT",
        default_value = "30s",
        value_parser = parse_interval
    )]
    pub ack_wait: Duration,
    /// A RabbitMQ queue to read (repeatable, or a comma list), each an ordered stream read by
    /// one instance at a time (single active consumer). Declared durable at start when missing.
    #[arg(
        long = "queue",
        env = "BATCH_INBOX_QUEUE",
        value_name = "QUEUE",
        value_delimiter = ','
    )]
    pub queues: Vec<String>,
    /// The RabbitMQ queues' type, declared with them: `classic` or `quorum`. A queue that exists
    /// with another type or arguments is refused at start.
    #[arg(
        long,
        env = "BATCH_INBOX_QUEUE_TYPE",
        value_parser = batch_inbox::internals::flags::named::<QueueType>(),
        default_value_t = QueueType::Classic
    )]
    pub queue_type: QueueType,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub pipeline: PipelineArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub handler: HandlerArgs,
    /// Exit 0 once the consumer group has committed every partition of the topic to its end
    /// (this member's and the others': a backfill is done only when the whole topic is).
    #[arg(long, env = "BATCH_INBOX_EXIT_ON_EOF")]
    pub exit_on_eof: bool,
    /// Remove inbox rows older than this in the background (`7d`, `36h`; off by default), and
    /// dead-letter UUIDv7 ids older than it (`outside_dedup_window`).
    #[arg(long, env = "BATCH_INBOX_RETENTION", value_parser = parse_retention)]
    pub retention: Option<Duration>,
    /// Dead-letter UUIDv7 ids older than this without cleaning up here (for a `cleanup` run
    /// elsewhere); defaults to --retention.
    #[arg(long, env = "BATCH_INBOX_DEDUP_WINDOW", value_parser = parse_retention)]
    pub dedup_window: Option<Duration>,
    /// Seconds between two background cleanups (with --retention) or partition preparations.
    #[arg(long, default_value_t = defaults::CLEANUP_INTERVAL_S, value_parser = clap::value_parser!(u64).range(1..))]
    pub cleanup_interval_s: u64,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub cleanup: CleanupArgs,
    /// Store each partition's next offset in the database, in the batch's transaction, and
    /// start an assigned partition there when it is ahead of Kafka's committed offset (no
    /// replay after a crash). `--offsets-in-db=false`: Kafka's committed offsets only.
    #[arg(long, env = "BATCH_INBOX_OFFSETS_IN_DB", default_value_t = defaults::OFFSETS_IN_DB, action = clap::ArgAction::Set)]
    pub offsets_in_db: bool,
    /// TEST-ONLY CONTROL, UNSAFE: store offsets before the database commit, so faults lose
    /// messages. Exists to show that fault checks can fail (`unsafe-controls` builds only).
    #[cfg(feature = "unsafe-controls")]
    #[arg(long, hide = true, env = "BATCH_INBOX_UNSAFE_OFFSETS_BEFORE_COMMIT")]
    pub unsafe_offsets_before_commit: bool,
    /// TEST-ONLY CONTROL, UNSAFE: no deduplication and no inbox rows, so redeliveries are
    /// applied twice. Exists to show that fault checks can fail (`unsafe-controls` builds only).
    #[cfg(feature = "unsafe-controls")]
    #[arg(long, hide = true, env = "BATCH_INBOX_UNSAFE_NO_INBOX")]
    pub unsafe_no_inbox: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ops: OpsArgs,
}

/// Operations flags of `run`: metrics and health endpoints, summary log lines.
#[derive(Debug, Clone, Args)]
pub struct OpsArgs {
    /// Serve /metrics (Prometheus), /healthz and /readyz on this address, e.g. 127.0.0.1:9464
    /// (off when absent).
    #[arg(long, env = "BATCH_INBOX_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Log a summary line (msgs/s, new, duplicate ratio, dead letters, lag) this often: 10s,
    /// 500ms, 1m; 0 turns it off.
    #[arg(
        long,
        env = "BATCH_INBOX_LOG_INTERVAL",
        default_value = defaults::LOG_INTERVAL,
        value_parser = parse_interval
    )]
    pub log_interval: Duration,
    /// Write the run's counters, throughput, latency percentiles and peak memory as JSON to this
    /// file, every --stats-interval and at exit (replaced atomically; schema in
    /// docs/OPERATIONS.md).
    #[arg(long, env = "BATCH_INBOX_STATS_FILE", value_name = "FILE")]
    pub stats_file: Option<std::path::PathBuf>,
    /// How often --stats-file is rewritten: 1s, 250ms.
    #[arg(
        long,
        env = "BATCH_INBOX_STATS_INTERVAL",
        default_value = defaults::STATS_INTERVAL,
        value_parser = parse_interval
    )]
    pub stats_interval: Duration,
    /// Print every setting with its value and source (flag, env, file, default), then exit.
    #[arg(long)]
    pub print_config: bool,
}

impl RunArgs {
    /// Refuses handler settings that would be silently unused or that do not fit the topics.
    pub fn check_handler(&self) -> Result<(), String> {
        self.handler.check()?;
        if !self.streams.is_empty() && !matches!(self.source, Some(SourceUrl::Nats(_))) {
            return Err(
                "--stream reads a NATS JetStream stream: give the server with --source nats://…"
                    .to_owned(),
            );
        }
        if !self.queues.is_empty() && matches!(self.source, Some(SourceUrl::Nats(_))) {
            return Err(
                "--queue reads a RabbitMQ queue; a NATS JetStream stream is read with --stream"
                    .to_owned(),
            );
        }
        match &self.source {
            Some(SourceUrl::Nats(_)) if self.streams.is_empty() => {
                Err("--source nats://… reads JetStream streams: give --stream".to_owned())
            }
            Some(SourceUrl::Nats(_)) => self
                .handler
                .check_routes(&super::args::distinct(&self.streams)),
            Some(SourceUrl::Amqp(_)) => self.handler.check_routes(&self.distinct_queues()),
            None if !self.queues.is_empty() => Err(
                "--queue reads a RabbitMQ queue: give the broker with --source amqp://…".to_owned(),
            ),
            None => self.handler.check_routes(&self.kafka.distinct_topics()),
        }
    }

    /// Processor configuration from the flags.
    pub fn processor(&self) -> ProcessorConfig {
        let mut kafka = KafkaSettings::with_topics(
            &self.kafka.brokers,
            self.kafka.distinct_topics(),
            &self.group,
        );
        kafka.partition_eof = self.exit_on_eof;
        kafka.overrides = self.kafka.properties.clone();
        let mut config = self.pipeline.processor(kafka, self.exit_on_eof);
        (config.decoding.tombstones, config.decoding.values) = self.handler.reading();
        #[cfg(feature = "unsafe-controls")]
        {
            config.worker.unsafe_controls = batch_inbox::UnsafeControls::new(
                self.unsafe_offsets_before_commit,
                self.unsafe_no_inbox,
            );
        }
        config.offsets_in_db = self.offsets_in_db;
        config.dedup_window = self.dedup_window.or(self.retention);
        if let Some(SourceUrl::Nats(url)) = &self.source {
            let consumer = self.consumer.clone().unwrap_or_else(|| self.group.clone());
            let streams = super::args::distinct(&self.streams);
            let mut nats = NatsSettings::new(url.clone(), streams, consumer);
            nats.filter_subject = self.filter_subject.clone();
            nats.ack_wait = self.ack_wait;
            nats.batch_size = self.pipeline.batch_size.get();
            config.nats = Some(nats);
            // A JetStream record's id: the Nats-Msg-Id header (JetStream's own publish dedup
            // key) unless told otherwise.
            if self.pipeline.ids.id_header == defaults::ID_HEADER {
                config.decoding.ids.header = "Nats-Msg-Id".to_owned();
            }
        }
        if let Some(SourceUrl::Amqp(url)) = &self.source {
            let mut amqp = AmqpSettings::new(url.clone(), self.distinct_queues(), &self.group);
            amqp.queue_type = self.queue_type;
            amqp.prefetch = AmqpSettings::prefetch_for(self.pipeline.batch_size.get());
            config.amqp = Some(amqp);
            // A queue's record id: the message_id property unless told otherwise.
            if self.pipeline.ids.id_from.is_none() {
                config.decoding.ids.source = batch_inbox::IdSource::Key;
            }
        }
        config
    }

    /// The queues, each once, in the order given.
    fn distinct_queues(&self) -> Vec<String> {
        super::args::distinct(&self.queues)
    }
}

/// `--source`: the broker that is not Kafka.
#[derive(Debug, Clone)]
pub enum SourceUrl {
    /// RabbitMQ.
    Amqp(AmqpUrl),
    /// NATS JetStream.
    Nats(NatsUrl),
}

/// `--source`: a RabbitMQ or NATS URL. Its error never quotes the value, which may hold a
/// password (clap's own error would).
#[derive(Clone)]
struct SourceParser;

impl clap::builder::TypedValueParser for SourceParser {
    type Value = SourceUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        match value.to_str() {
            Some(s) if AmqpUrl::is_amqp(s) => Ok(SourceUrl::Amqp(AmqpUrl::new(s.trim()))),
            Some(s) if NatsUrl::is_nats(s) => Ok(SourceUrl::Nats(NatsUrl::new(s.trim()))),
            _ => Err(clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                "--source takes a RabbitMQ URL (amqp://… or amqps://…) or a NATS URL (nats://…) \
                 (the value is not shown: it may hold a password); Kafka is read with --brokers\n",
            )
            .with_cmd(cmd)),
        }
    }
}

#[cfg(test)]
mod tests;

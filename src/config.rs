//! Command line: flags, environment fallbacks, validation into typed values.
//!
//! Every value is checked before anything is consumed: a zero batch size or an unknown mode is
//! refused by the parser with a one-line reason.

use std::num::NonZeroUsize;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::batcher::{BatcherSettings, Batching};
use crate::consumer::KafkaSettings;
use crate::defaults;
use crate::inbox::Mode;
use crate::logging::LogFormat;
use crate::processor::ProcessorConfig;
use crate::secret::{DatabaseUrl, RedactedProperties};
use crate::worker::{MaxPoisonRate, RetryPolicy, WorkerSettings};

mod dead_letters;
mod retention;

pub use dead_letters::{DeadLettersArgs, DeadLettersCommand, ListArgs, RedriveArgs};
pub use retention::{parse_retention, CleanupArgs, CleanupCommandArgs, MigrateArgs};

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
}

/// Database connection.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL connection URL (or `key=value` string); its password is never shown.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = defaults::DATABASE_URL
    )]
    pub database_url: DatabaseUrl,
}

/// Kafka connection. `Debug` hides the values of sensitive properties.
#[derive(Clone, Args)]
pub struct KafkaArgs {
    /// Bootstrap servers of any Kafka-protocol broker.
    #[arg(long, env = "KAFKA_BROKERS", default_value = defaults::BROKERS)]
    pub brokers: String,
    /// Topic to consume or produce to.
    #[arg(long, env = "BATCH_INBOX_TOPIC", default_value = defaults::TOPIC)]
    pub topic: String,
    /// librdkafka property passed through, as `key=value` (repeatable), applied last.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = PropertyParser)]
    pub properties: Vec<(String, String)>,
}

impl std::fmt::Debug for KafkaArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let KafkaArgs {
            brokers,
            topic,
            properties,
        } = self;
        f.debug_struct("KafkaArgs")
            .field("brokers", brokers)
            .field("topic", topic)
            .field("properties", &RedactedProperties(properties))
            .finish()
    }
}

/// Processing settings shared by `run` and `demo`.
#[derive(Debug, Clone, Args)]
pub struct PipelineArgs {
    /// Transactions per micro-batch (`batched`) or per message (`per-message`, the baseline).
    #[arg(long, env = "BATCH_INBOX_MODE", value_enum, default_value_t = Mode::Batched)]
    pub mode: Mode,
    /// Largest batch, in messages.
    #[arg(long, env = "BATCH_INBOX_BATCH_SIZE", default_value_t = defaults::BATCH_SIZE)]
    pub batch_size: NonZeroUsize,
    /// With linger batching, the longest wait after a batch's first message before it is applied
    /// (default 20); with natural batching, the shortest (default 0). In milliseconds, at most an
    /// hour.
    #[arg(
        long,
        env = "BATCH_INBOX_BATCH_LINGER_MS",
        value_parser = clap::value_parser!(u64).range(..=MAX_LINGER_MS)
    )]
    pub batch_linger_ms: Option<u64>,
    /// When a batch closes besides its size limits: `natural` (as soon as no more record is
    /// ready, and no sooner than --batch-linger-ms) or `linger` (after --batch-linger-ms).
    #[arg(long, env = "BATCH_INBOX_BATCHING", value_enum, default_value_t = defaults::BATCHING)]
    pub batching: Batching,
    /// Largest batch, in bytes of keys, values, header names and values, plus 64 bytes per
    /// header and the size of a record's owned copy per record.
    #[arg(long, env = "BATCH_INBOX_BATCH_MAX_BYTES", default_value_t = defaults::BATCH_MAX_BYTES)]
    pub batch_max_bytes: NonZeroUsize,
    /// Database connections (at most one transaction per partition runs at a time).
    #[arg(long, env = "BATCH_INBOX_POOL_SIZE", default_value_t = defaults::POOL_SIZE)]
    pub pool_size: NonZeroUsize,
    /// Header that carries the message id (a UUID); CloudEvents users pass `ce_id`.
    #[arg(long, env = "BATCH_INBOX_ID_HEADER", default_value = defaults::ID_HEADER)]
    pub id_header: String,
    /// At most N poison dead letters per partition within DURATION (`20/1m`, `5/10s`); the one
    /// that would exceed it is not dead-lettered: the partition stalls on it until a retry of it
    /// succeeds (or a restart with a higher limit). `off` disables the breaker.
    #[arg(
        long,
        env = "BATCH_INBOX_MAX_POISON_RATE",
        value_name = "N/DURATION",
        default_value = defaults::MAX_POISON_RATE
    )]
    pub max_poison_rate: MaxPoisonRate,
    /// Each statement's `statement_timeout` on the processor's connections (`30s`, `500ms`;
    /// `0`: the server's). A batch that times out 3 times is bisected; a single message that
    /// still does stalls its partition. The client gives up on a transaction that gets no answer
    /// within twice this (a black-holed connection).
    #[arg(
        long,
        env = "BATCH_INBOX_STATEMENT_TIMEOUT",
        default_value = defaults::STATEMENT_TIMEOUT_FLAG,
        value_parser = crate::logging::parse_interval
    )]
    pub statement_timeout: Duration,
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
    /// Consumer group.
    #[arg(long, env = "BATCH_INBOX_GROUP", default_value = defaults::GROUP)]
    pub group: String,
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

/// The handler: what applies the new messages (`run`, `dead-letters redrive`).
#[derive(Debug, Clone, Args)]
pub struct HandlerArgs {
    /// What applies the new messages: `ledger` (the reference account ledger) or `sql` (the
    /// statement of --apply-sql).
    #[arg(
        id = "handler",
        long = "handler",
        env = "BATCH_INBOX_HANDLER",
        value_enum,
        default_value_t = HandlerKind::Ledger
    )]
    pub kind: HandlerKind,
    /// With --handler sql: a file holding one SQL statement, run once per batch in the batch's
    /// transaction with $1 = its new messages as a jsonb array (docs/SQL-HANDLER.md).
    #[arg(
        long,
        env = "BATCH_INBOX_APPLY_SQL",
        value_name = "FILE",
        required_if_eq("handler", "sql")
    )]
    pub apply_sql: Option<std::path::PathBuf>,
}

impl HandlerArgs {
    /// Refuses a statement file without the SQL handler (it would be silently unused).
    pub fn check(&self) -> Result<(), String> {
        match (self.kind, &self.apply_sql) {
            (HandlerKind::Ledger, Some(_)) => {
                Err("--apply-sql is the SQL handler's statement: add --handler sql".to_owned())
            }
            _ => Ok(()),
        }
    }
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
        value_parser = crate::logging::parse_interval
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
        value_parser = crate::logging::parse_interval
    )]
    pub stats_interval: Duration,
    /// Print every setting with its value and source (flag, env, file, default), then exit.
    #[arg(long)]
    pub print_config: bool,
}

/// The handler of `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HandlerKind {
    /// The reference handler: account balances that never go below zero.
    #[default]
    Ledger,
    /// One SQL statement per batch, from --apply-sql.
    Sql,
}

/// Longest batch linger: far beyond any useful one, and far from overflowing a deadline.
const MAX_LINGER_MS: u64 = 3_600_000;

/// Parses `-X KEY=VALUE`. Its error never quotes the argument, which may hold a secret.
#[derive(Clone)]
struct PropertyParser;

impl clap::builder::TypedValueParser for PropertyParser {
    type Value = (String, String);

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        match value.to_str().and_then(|s| s.split_once('=')) {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
            _ => {
                use clap::error::{ContextKind, ContextValue, ErrorKind};
                let mut e = clap::Error::raw(
                    ErrorKind::ValueValidation,
                    "-X expects KEY=VALUE: a librdkafka property, `=`, its value (the argument \
                     is not shown: it may hold a secret)\n",
                )
                .with_cmd(cmd);
                e.insert(
                    ContextKind::InvalidArg,
                    ContextValue::String("-X <KEY=VALUE>".to_owned()),
                );
                Err(e)
            }
        }
    }
}

impl PipelineArgs {
    /// The batch linger in milliseconds: the flag's, or the default of the batching.
    pub fn linger_ms(&self) -> u64 {
        self.batch_linger_ms
            .unwrap_or(defaults::linger_ms(self.batching))
    }

    /// Worker settings from the flags.
    pub fn worker(&self) -> WorkerSettings {
        WorkerSettings {
            mode: self.mode,
            batcher: BatcherSettings {
                max_items: self.batch_size,
                max_bytes: self.batch_max_bytes,
                linger: Duration::from_millis(self.linger_ms()),
            },
            batching: self.batching,
            retry: RetryPolicy::default(),
            max_poison_rate: self.max_poison_rate.0,
            consume_only: false,
            unsafe_controls: Default::default(),
        }
    }

    /// Processor configuration for `kafka`: the library's defaults with these flags.
    pub fn processor(&self, kafka: KafkaSettings, exit_on_eof: bool) -> ProcessorConfig {
        let mut config = ProcessorConfig::new(kafka);
        config.worker = self.worker();
        config.id_header = self.id_header.clone();
        config.exit_on_eof = exit_on_eof;
        config.statement_timeout = Some(self.statement_timeout).filter(|t| !t.is_zero());
        config
    }
}

impl RunArgs {
    /// Refuses a statement file without the SQL handler (it would be silently unused).
    pub fn check_handler(&self) -> Result<(), String> {
        self.handler.check()
    }

    /// Processor configuration from the flags.
    pub fn processor(&self) -> ProcessorConfig {
        let kafka = KafkaSettings {
            brokers: self.kafka.brokers.clone(),
            topic: self.kafka.topic.clone(),
            group: self.group.clone(),
            partition_eof: self.exit_on_eof,
            overrides: self.kafka.properties.clone(),
        };
        let mut config = self.pipeline.processor(kafka, self.exit_on_eof);
        #[cfg(feature = "unsafe-controls")]
        {
            config.worker.unsafe_controls = crate::unsafe_controls::UnsafeControls::new(
                self.unsafe_offsets_before_commit,
                self.unsafe_no_inbox,
            );
        }
        config.offsets_in_db = self.offsets_in_db;
        config.dedup_window = self.dedup_window.or(self.retention);
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("batch-inbox").chain(args.iter().copied()))
    }

    #[test]
    fn bad_flags_are_refused_with_a_reason() {
        for (args, needle) in [
            (vec!["run", "--batch-size", "0"], "--batch-size"),
            (vec!["run", "--mode", "sometimes"], "--mode"),
            (vec!["run", "-X", "novalue"], "KEY=VALUE"),
            // Consume-only stores offsets without applying: not a value of the command line.
            (vec!["run", "--mode", "consume-only"], "--mode"),
            (vec!["produce"], "unrecognized subcommand"),
            (vec!["run", "--retention", "7"], "unit"),
            (vec!["cleanup", "--retention", "0d"], "zero"),
            (vec!["cleanup"], "--retention"),
            (
                vec!["run", "--max-poison-rate", "0/1m"],
                "--max-poison-rate",
            ),
            (vec!["run", "--max-poison-rate", "often"], "N/DURATION"),
            (
                vec!["run", "--statement-timeout", "1y"],
                "--statement-timeout",
            ),
        ] {
            let err = parse(&args).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn a_bad_property_is_refused_without_quoting_it() {
        let err = parse(&["run", "-X", "sasl.password:Sup3rS3cretPw"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("-X expects KEY=VALUE") && !err.contains("Sup3rS3cretPw"),
            "{err}"
        );
    }

    #[test]
    fn a_linger_that_would_overflow_a_deadline_is_refused() {
        let err = parse(&["run", "--batch-linger-ms", "18446744073709551615"]).unwrap_err();
        assert!(err.to_string().contains("--batch-linger-ms"), "{err}");
        let Command::Run(run) = parse(&["run", "--batch-linger-ms", "3600000"])
            .unwrap()
            .command
        else {
            panic!("not run")
        };
        assert_eq!(
            run.processor().worker.batcher.linger,
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn flags_become_typed_settings() {
        let cli = parse(&[
            "run",
            "--mode",
            "per-message",
            "--batch-size",
            "7",
            "--batch-linger-ms",
            "3",
            "-X",
            "fetch.min.bytes=1",
            "--id-header",
            "ce_id",
            "--exit-on-eof",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        let p = run.processor();
        assert_eq!(p.worker.mode, Mode::PerMessage);
        assert_eq!(p.worker.batcher.max_items.get(), 7);
        assert_eq!(p.worker.batcher.linger, Duration::from_millis(3));
        assert_eq!(p.id_header, "ce_id");
        assert_eq!(p.dedup_window, None, "no guard without a retention");
        assert_eq!(
            p.worker.max_poison_rate,
            Some(crate::worker::PoisonRate::DEFAULT),
            "the breaker is on by default"
        );
        assert_eq!(p.statement_timeout, Some(Duration::from_secs(30)));
        assert!(p.exit_on_eof && p.kafka.partition_eof);
        assert_eq!(
            p.kafka.overrides,
            vec![("fetch.min.bytes".into(), "1".into())]
        );
        let config = p.kafka.client_config();
        assert_eq!(config.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(config.get("fetch.min.bytes"), Some("1"));
    }

    #[test]
    fn the_breaker_can_be_turned_off_and_a_zero_timeout_is_the_servers() {
        let Command::Run(run) = parse(&[
            "run",
            "--max-poison-rate",
            "off",
            "--statement-timeout",
            "0",
        ])
        .unwrap()
        .command
        else {
            panic!("not run")
        };
        let p = run.processor();
        assert_eq!(p.worker.max_poison_rate, None);
        assert_eq!(p.statement_timeout, None);
    }

    #[test]
    fn unsafe_controls_are_hidden_and_off_by_default() {
        let Command::Run(run) = parse(&["run"]).unwrap().command else {
            panic!("not run")
        };
        assert!(run.processor().worker.unsafe_controls.switches().is_empty());
        assert!(
            run.processor().offsets_in_db,
            "offsets in the database by default"
        );
        let Command::Run(run) = parse(&["run", "--offsets-in-db=false"]).unwrap().command else {
            panic!("not run")
        };
        assert!(!run.processor().offsets_in_db);
        let unsafe_flags = ["run", "--unsafe-offsets-before-commit", "--unsafe-no-inbox"];
        if cfg!(feature = "unsafe-controls") {
            let Command::Run(run) = parse(&unsafe_flags).unwrap().command else {
                panic!("not run")
            };
            assert_eq!(run.processor().worker.unsafe_controls.switches().len(), 2);
        } else {
            let err = parse(&unsafe_flags).unwrap_err().to_string();
            assert!(err.contains("unexpected argument"), "{err}");
        }
        let help = parse(&["run", "--help"]).unwrap_err().to_string();
        assert!(
            help.contains("--batch-size") && !help.contains("unsafe"),
            "{help}"
        );
    }

    #[test]
    fn the_sql_handler_needs_its_statement_and_the_statement_its_handler() {
        let err = parse(&["run", "--handler", "sql"]).unwrap_err().to_string();
        assert!(err.contains("--apply-sql"), "{err}");
        let run = |args: &[&str]| match parse(args).unwrap().command {
            Command::Run(run) => run,
            _ => panic!("not run"),
        };
        let sql = run(&["run", "--handler", "sql", "--apply-sql", "x.sql"]);
        assert_eq!(sql.handler.kind, HandlerKind::Sql);
        assert_eq!(sql.check_handler(), Ok(()));
        let ledger = run(&["run"]);
        assert_eq!(
            (ledger.handler.kind, ledger.check_handler()),
            (HandlerKind::Ledger, Ok(()))
        );
        let stray = run(&["run", "--apply-sql", "x.sql"]);
        assert!(stray.check_handler().unwrap_err().contains("--handler sql"));
    }

    #[test]
    fn retention_turns_on_the_dedup_window_guard() {
        let cli = parse(&["run", "--retention", "7d", "--cleanup-batch-rows", "100"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        let week = Duration::from_secs(7 * 86_400);
        assert_eq!(run.processor().dedup_window, Some(week));
        let settings = run.cleanup.settings(week);
        assert_eq!((settings.retention, settings.batch_rows), (week, 100));
        let cli = parse(&["run", "--retention", "7d", "--dedup-window", "2d"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(
            run.processor().dedup_window,
            Some(Duration::from_secs(2 * 86_400))
        );
    }
}

//! The flags shared by the binary's commands and the load tools' (`batch-inbox-tools`), so that
//! both take the same flags: the database, the Kafka connection, and the pipeline's settings,
//! each converted into the library's types. Not part of the library's API for embedding
//! services (hidden from its documentation): a service builds `ProcessorConfig` itself.
//!
//! Every value is checked before anything is consumed: a zero batch size or an unknown mode is
//! refused by the parser with a one-line reason.

use std::num::NonZeroUsize;
use std::time::Duration;

use clap::Args;

use crate::names::{parse_interval, Named};
use crate::pipeline::batcher::Batching;
use crate::pipeline::defaults;
use crate::pipeline::inbox::Mode;
use crate::pipeline::message::{IdFormat, IdRules, IdSource};
use crate::pipeline::worker::{MaxPoisonLimit, WorkerSettings};
use crate::processor::ProcessorConfig;
use crate::secret::{DatabaseUrl, RedactedProperties};
use crate::source::kafka::consumer::KafkaSettings;

/// The parser of a flag that takes one of a setting's names: the library's own `FromStr`, with
/// the names listed in `--help` and in clap's error.
pub fn named<T: Named + Clone>() -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(T::NAMES).try_map(|s| s.parse::<T>())
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
    /// Topic to consume (repeatable, or a comma list: `--topic a,b`) or to produce to (one).
    #[arg(
        long = "topic",
        env = "BATCH_INBOX_TOPIC",
        value_name = "TOPIC",
        value_delimiter = ',',
        value_parser = parse_topic,
        default_value = defaults::TOPIC
    )]
    pub topics: Vec<String>,
    /// librdkafka property passed through, as `key=value` (repeatable), applied last.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = PropertyParser)]
    pub properties: Vec<(String, String)>,
}

impl std::fmt::Debug for KafkaArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let KafkaArgs {
            brokers,
            topics,
            properties,
        } = self;
        f.debug_struct("KafkaArgs")
            .field("brokers", brokers)
            .field("topics", topics)
            .field("properties", &RedactedProperties(properties))
            .finish()
    }
}

impl KafkaArgs {
    /// The first topic: the one a tool produces to or reads (the tools refuse several).
    #[allow(dead_code)] // the tools' only: `run` consumes every topic
    pub fn topic(&self) -> &str {
        self.topics.first().map_or(defaults::TOPIC, String::as_str)
    }

    /// The topics, each once, in the order given.
    pub fn distinct_topics(&self) -> Vec<String> {
        distinct(&self.topics)
    }
}

/// `names`, each once, in the order given.
pub fn distinct(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for n in names {
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

/// A Kafka topic name: 1 to 249 of `a-z A-Z 0-9 . _ -`, and neither `.` nor `..` (Kafka's
/// rule, which every Kafka-protocol broker applies).
pub fn parse_topic(s: &str) -> Result<String, String> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if s.is_empty() {
        return Err("a topic name cannot be empty".to_owned());
    }
    if s.len() > 249 || !s.chars().all(legal) || s == "." || s == ".." {
        return Err(format!(
            "{s:?} is not a Kafka topic name (1 to 249 of a-z, A-Z, 0-9, '.', '_' and '-')"
        ));
    }
    Ok(s.to_owned())
}

/// Where a record's id comes from and which ids are accepted (`run`, `dead-letters redrive`).
#[derive(Debug, Clone, Args)]
pub struct IdArgs {
    /// Header that carries the message id (with --id-from header); CloudEvents users pass
    /// `ce_id`.
    #[arg(long, env = "BATCH_INBOX_ID_HEADER", default_value = defaults::ID_HEADER)]
    pub id_header: String,
    /// Where the id comes from: `header` (--id-header), `key` (the record key: on a compacted
    /// topic only the first record of each key is ever applied; on a RabbitMQ queue the
    /// message_id property) or `position` (topic, partition and offset: each record once, but a
    /// producer's resend is a new record; refused for a queue). Default: `header` on Kafka,
    /// `key` (message_id) on RabbitMQ.
    #[arg(
        long,
        env = "BATCH_INBOX_ID_FROM",
        value_parser = named::<IdSource>()
    )]
    pub id_from: Option<IdSource>,
    /// Which ids are accepted: `uuid` (UUID text only) or `any` (any non-empty value up to
    /// 1024 bytes; one that is not a UUID maps to a version-8 UUID of the topic and the id).
    #[arg(
        long,
        env = "BATCH_INBOX_ID_FORMAT",
        value_parser = named::<IdFormat>(),
        default_value_t = IdFormat::Uuid
    )]
    pub id_format: IdFormat,
}

impl IdArgs {
    /// The library's id rules.
    pub fn rules(&self) -> IdRules {
        let mut rules = IdRules::header(&self.id_header);
        rules.source = self.id_from.unwrap_or(IdSource::Header);
        rules.format = self.id_format;
        rules
    }
}

/// Processing settings shared by `run` and `demo`.
#[derive(Debug, Clone, Args)]
pub struct PipelineArgs {
    /// Transactions per micro-batch (`batched`) or per message (`per-message`, the baseline).
    #[arg(long, env = "BATCH_INBOX_MODE", value_parser = named::<Mode>(), default_value_t = Mode::Batched)]
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
    #[arg(
        long,
        env = "BATCH_INBOX_BATCHING",
        value_parser = named::<Batching>(),
        default_value_t = defaults::BATCHING
    )]
    pub batching: Batching,
    /// Largest batch, in bytes of keys, values, header names and values, plus 64 bytes per
    /// header and the size of a record's owned copy per record.
    #[arg(long, env = "BATCH_INBOX_BATCH_MAX_BYTES", default_value_t = defaults::BATCH_MAX_BYTES)]
    pub batch_max_bytes: NonZeroUsize,
    /// Database connections (at most one transaction per partition runs at a time).
    #[arg(long, env = "BATCH_INBOX_POOL_SIZE", default_value_t = defaults::POOL_SIZE)]
    pub pool_size: NonZeroUsize,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ids: IdArgs,
    /// The poison-rate breaker: a partition stalls instead of dead-lettering a poison message
    /// when more than P % of the last W messages it tried failed, that one included, and more
    /// than N of them (`50%/100,min=20`; `,min=N` may be left out). It stalls on that message
    /// until a retry of it succeeds (or a restart with a higher limit). `off` disables the
    /// breaker; the form of before 0.3, `N/DURATION`, is the floor N with the default share.
    #[arg(
        long,
        env = "BATCH_INBOX_MAX_POISON_RATE",
        value_name = "P%/W[,min=N]",
        default_value = defaults::MAX_POISON_RATE
    )]
    pub max_poison_rate: MaxPoisonLimit,
    /// Each statement's `statement_timeout` on the processor's connections (`30s`, `500ms`;
    /// `0`: the server's). A batch that times out 3 times is bisected; a single message that
    /// still does stalls its partition. The client gives up on a transaction that gets no answer
    /// within twice this (a black-holed connection).
    #[arg(
        long,
        env = "BATCH_INBOX_STATEMENT_TIMEOUT",
        default_value = defaults::STATEMENT_TIMEOUT_FLAG,
        value_parser = parse_interval
    )]
    pub statement_timeout: Duration,
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
        let mut worker = WorkerSettings {
            mode: self.mode,
            batching: self.batching,
            ..WorkerSettings::default()
        };
        worker.batcher.max_items = self.batch_size;
        worker.batcher.max_bytes = self.batch_max_bytes;
        worker.batcher.linger = Duration::from_millis(self.linger_ms());
        worker.set_poison_limit(self.max_poison_rate.0);
        worker
    }

    /// Processor configuration for `kafka`: the library's defaults with these flags.
    pub fn processor(&self, kafka: KafkaSettings, exit_on_eof: bool) -> ProcessorConfig {
        let mut config = ProcessorConfig::new(kafka);
        config.worker = self.worker();
        config.decoding.ids = self.ids.rules();
        config.exit_on_eof = exit_on_eof;
        config.statement_timeout = Some(self.statement_timeout).filter(|t| !t.is_zero());
        config
    }
}

//! The setup of a chaos run: its flags, its errors, and its plan (names, input and model), all
//! derived from the seed so that a failing seed replays the same input.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::generate::{generate, Expected, GeneratorSettings, KeyDistribution, Record};
use batch_inbox::DbError;

/// `chaos` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// PostgreSQL database for the run: empty, on a server the run may restart.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Bootstrap servers of any Kafka-protocol broker.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// An existing topic with --partitions partitions; a new topic is created when absent.
    #[arg(long)]
    pub topic: Option<String>,
    /// Length of the fault phase, in seconds (then the run heals and drains).
    #[arg(long, default_value_t = 120)]
    pub duration: u64,
    /// Seed of the input and of every fault choice; random (and printed) when absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Processor processes at the start.
    #[arg(long, default_value_t = 3)]
    pub processors: usize,
    /// Partitions of the topic (on RabbitMQ: queues, one per account modulo their number).
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Read RabbitMQ instead of Kafka: the broker's URL (its password is never shown). The
    /// processors read --partitions queues with single active consumer; the input is published
    /// with publisher confirms; the broker's own counts come from --amqp-ctl.
    #[arg(long, env = "CHAOS_AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,
    /// rabbitmqctl for the run's node (scripts/rabbitmq/lib.sh's AMQP_CTL), for the queues'
    /// depths at the end.
    #[arg(long, requires = "amqp_url")]
    pub amqp_ctl: Option<PathBuf>,
    /// The RabbitMQ queues' type: classic or quorum.
    #[arg(long, value_parser = batch_inbox::internals::flags::named::<batch_inbox::QueueType>(), default_value_t = batch_inbox::QueueType::Classic)]
    pub queue_type: batch_inbox::QueueType,
    /// The processors' AMQP heartbeat in seconds (`?heartbeat=` of their URL): the broker closes
    /// a paused processor's connection after missing it, and a standby takes its queues over.
    /// Pauses last three times this, and more, on RabbitMQ (--session-timeout-ms is Kafka's).
    #[arg(long, default_value_t = 3)]
    pub amqp_heartbeat: u64,
    /// Read NATS JetStream instead of Kafka: the server's URL (its password is never shown).
    /// The processors read --partitions streams (each account's records in one, by account
    /// modulo their number) through one durable pull consumer each, one processor per stream
    /// at a time (the stream's advisory lock in the database); the input is published with each
    /// publish acknowledged, and published again after a server restart.
    #[arg(
        long,
        env = "CHAOS_NATS_URL",
        hide_env_values = true,
        conflicts_with = "amqp_url"
    )]
    pub nats_url: Option<String>,
    /// The consumers' ack_wait in ms (the processors' --ack-wait). Pauses last longer than it
    /// and the standbys' lock poll (1 s) on NATS.
    #[arg(long, default_value_t = 2000)]
    pub nats_ack_wait_ms: u64,
    /// The streams' duplicate window in ms (at least 100): a publish whose Nats-Msg-Id the
    /// stream saw within it is dropped. Short by default, so that the input's re-sent records
    /// and the copies published again after a server restart reach the processors (the inbox
    /// skips them) as they would on Kafka; those published close together are dropped by the
    /// stream.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..))]
    pub nats_duplicate_window_ms: u64,
    /// NATS: a pause also ends the paused processor's lock sessions in the database (as a
    /// database whose keepalives drop a frozen host would), so that a standby takes its streams
    /// over while it is stopped. `--pause-ends-sessions=false`: the paused processor keeps its
    /// streams, and its own deliveries come back to it after ack_wait.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub pause_ends_sessions: bool,
    /// Input records per second while producing (the first 80% of the fault phase).
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Number of accounts of the input.
    #[arg(long, default_value_t = 100)]
    pub accounts: u64,
    /// Shell command that stops the database like a crash; with --db-start-command, enables
    /// database restarts.
    #[arg(long)]
    pub db_stop_command: Option<String>,
    /// Shell command that starts the database again.
    #[arg(long)]
    pub db_start_command: Option<String>,
    /// Shell command of a failover to a replica that lags behind (`{group}` replaced by the
    /// group): it cuts the replication, lets the primary run ahead, kills it and promotes the
    /// replica, and prints the promoted database's positions of the group, one
    /// `PARTITION NEXT_OFFSET` line each; enables failovers. Committed offsets may then move
    /// back to those positions, never below.
    #[arg(long)]
    pub db_failover_command: Option<String>,
    /// Shell command that kills broker node `{node}` (1..=--broker-nodes) like a crash; with
    /// --broker-start-command, enables broker restarts.
    #[arg(long, requires = "broker_start_command")]
    pub broker_stop_command: Option<String>,
    /// Shell command that starts broker node `{node}` again on its own log and returns once it
    /// serves.
    #[arg(long, requires = "broker_stop_command")]
    pub broker_start_command: Option<String>,
    /// The broker's nodes, for --broker-stop-command.
    #[arg(long, default_value_t = 1)]
    pub broker_nodes: usize,
    /// What the broker is, for the results file (e.g. "Apache Kafka 4.4.0, 3 node(s)").
    #[arg(long, default_value = "")]
    pub broker_label: String,
    /// Extra flag for every processor (repeatable), e.g. an unsafe switch for the control run.
    #[arg(long = "processor-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub processor_args: Vec<String>,
    /// Marks the run as the control (a deliberately unsafe configuration) in the results.
    #[arg(long)]
    pub control: bool,
    /// The processors' group protocol: `classic`, or `consumer` (KIP-848: the broker assigns, and
    /// its `group.consumer.session.timeout.ms` is the session timeout, which
    /// --session-timeout-ms must then equal).
    #[arg(long, value_enum, default_value = "classic")]
    pub group_protocol: GroupProtocol,
    /// The processors' session timeout in ms; pauses last longer than this.
    #[arg(long, default_value_t = 6000)]
    pub session_timeout_ms: u64,
    /// Longest wait for the group to drain after the faults, in seconds.
    #[arg(long, default_value_t = 180)]
    pub drain_timeout: u64,
    /// Count every backwards move of a committed offset as a violation, also one right after a
    /// paused member resumed, and a committed offset past a partition's high watermark (a broker
    /// that fences stale members, as Apache Kafka and nisshi do, never accepts a removed member's
    /// commit). `--strict-offsets=false` tolerates and lists both, for a broker that does not
    /// fence (tansu 0.6 did not).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub strict_offsets: bool,
    /// Directory of the results file.
    #[arg(long, default_value = "results/chaos")]
    pub results_dir: PathBuf,
    /// Directory for the processors' logs and reports (a temporary one when absent).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

/// A consumer group protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupProtocol {
    /// The classic protocol: members assign, cooperative-sticky.
    Classic,
    /// KIP-848: the broker assigns.
    Consumer,
}

/// Failure of the chaos run itself (not an invariant violation).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// Kafka client failure.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A Kafka client could not be created.
    #[error(transparent)]
    KafkaClient(#[from] batch_inbox::KafkaClientError),
    /// Database setup failure.
    #[error("database: {0}")]
    Db(#[from] DbError),
    /// A statement failed.
    #[error("database: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// Files or processes.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Anything else that stops the run.
    #[error("{0}")]
    Setup(String),
}

/// What the run is about: names, input and model.
pub(super) struct Plan {
    pub(super) seed: u64,
    pub(super) topic: String,
    pub(super) group: String,
    pub(super) work: PathBuf,
    pub(super) records: Vec<Record>,
    pub(super) expected: Expected,
    pub(super) started_at: String,
    pub(super) stamp: String,
}

impl Plan {
    pub(super) fn new(args: &ChaosArgs) -> Result<Self, ChaosError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| ChaosError::Setup(e.to_string()))?;
        let seed = args.seed.unwrap_or(now.as_nanos() as u64 % 1_000_000_007);
        let started_at = utc_stamp(now.as_secs());
        // Unique per run, also for runs started in the same second (results, topic, group).
        let stamp = format!("{started_at}-seed{seed}-{}", std::process::id());
        let work = match &args.work_dir {
            Some(w) => w.clone(),
            None => std::env::temp_dir().join(format!("batch-inbox-chaos-{stamp}")),
        };
        std::fs::create_dir_all(&work)?;
        let producing = args.duration as f64 * 0.8;
        let (records, expected) = generate(GeneratorSettings {
            messages: (args.rate * producing) as u64,
            accounts: args.accounts,
            duplicate_ratio: 0.1,
            bad_ratio: 0.01,
            debit_ratio: 0.4,
            id_version: 4,
            seed,
            keys: KeyDistribution::Uniform,
        });
        Ok(Self {
            seed,
            topic: args
                .topic
                .clone()
                .unwrap_or_else(|| format!("chaos-{stamp}")),
            group: format!("chaos-{stamp}"),
            work,
            records,
            expected,
            started_at,
            stamp,
        })
    }
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the epoch (UTC).
fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: ChaosArgs,
    }

    fn strict(flags: &[&str]) -> bool {
        use clap::Parser;
        let argv = ["chaos", "--database-url", "postgres://x"]
            .iter()
            .chain(flags);
        Cli::try_parse_from(argv).unwrap().args.strict_offsets
    }

    #[test]
    fn offsets_are_checked_strictly_unless_told_otherwise() {
        assert!(strict(&[]));
        assert!(strict(&["--strict-offsets"]));
        assert!(!strict(&["--strict-offsets=false"]));
    }

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_796_017_392), "20261130T054312Z");
    }
}

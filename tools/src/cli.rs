//! The `batch-inbox-bench` command line: the tools' subcommands and their flags.

use crate::product_args::{DbArgs, KafkaArgs, PipelineArgs};
use clap::{Args, Parser, Subcommand};

use crate::generate::{GeneratorSettings, KeyDistribution, ValueEnvelope};

/// The toolbox of batch-inbox: load generator, model check, demo, load-test runs and reports,
/// COPY ceiling, chaos run. Not for production: it creates topics and databases, and the chaos
/// run kills processes.
#[derive(Debug, Parser)]
#[command(name = "batch-inbox-bench", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write generated ledger records (with duplicates, bad input, overdrafts) to a topic.
    Produce(ProduceArgs),
    /// Publish generated ledger records to RabbitMQ queues (the id in `message_id`, confirmed).
    AmqpPublish(crate::amqp_publish::AmqpPublishArgs),
    /// Read RabbitMQ queues and acknowledge by batches without any database (the broker's own
    /// floor). Never point it at queues whose records must be applied.
    AmqpConsumeOnly(crate::amqp_publish::AmqpConsumeOnlyArgs),
    /// Publish generated ledger records to a NATS JetStream stream (the id in `Nats-Msg-Id`,
    /// each publish acknowledged).
    NatsPublish(crate::nats_publish::NatsPublishArgs),
    /// A JetStream stream's message count and first and last sequence, as one line of JSON.
    NatsStreamInfo(crate::nats_publish::NatsStreamInfoArgs),
    /// Read JetStream streams and acknowledge by batches without any database (the server's own
    /// floor). Never point it at streams whose records must be applied.
    NatsConsumeOnly(crate::nats_publish::NatsConsumeOnlyArgs),
    /// Compare the database with the expected outcome written by `produce --expect`.
    Verify(VerifyArgs),
    /// Run the whole pipeline against an in-process Kafka mock cluster, in a database of its own.
    Demo(DemoArgs),
    /// One load-test run: start a processor command with a stats file, stop it after N records
    /// if asked, check the database against the model, and write the run's report.
    Drain(crate::drain::DrainArgs),
    /// Consume and batch a topic without any database, storing offsets (the broker and client
    /// ceiling of the load test). Never point it at a group whose records must be applied.
    ConsumeOnly(crate::drain::ConsumeOnlyArgs),
    /// Write `summary.md` and SVG plots from a load test's run reports.
    Summary(SummaryArgs),
    /// The database ceiling: binary COPY of an inbox's ids into an empty inbox-shaped table.
    CopyCeiling(CopyCeilingArgs),
    /// Fault injection under load (processes, database restarts, rebalances), then invariants;
    /// `chaos summary DIR`: the table of a directory's chaos runs.
    Chaos(crate::chaos::ChaosCli),
    /// The database-only ceiling: the load test's batches, the product's statements and handler,
    /// driven from memory against PostgreSQL with no Kafka.
    Replay(crate::replay::Args),
    /// A TCP proxy that delays every byte in each direction (a remote database for the load test).
    DelayProxy(crate::delay_proxy::DelayProxyArgs),
    /// CPU seconds of a run from /proc: a process, the broker, PostgreSQL, the machine
    /// (`cpu start`, `cpu stop`, or `cpu run -- COMMAND`).
    Cpu(crate::cpu::sample::CpuArgs),
    /// The comparison with the peers (scripts/peers/): result rows, the model's counts and
    /// rows, the results' tables.
    Peers(crate::peers::PeersArgs),
    /// Print the largest msgs/s (whole number) among the run reports of a prefix.
    BestRate(BestRateArgs),
    /// Write the load test's machine.json: the machine, the PostgreSQL server (with
    /// pg_test_fsync's fdatasync rate) and the run's parameters.
    Machine(crate::machine::MachineArgs),
    /// A load-test run's report: `report merge-acks` adds the producer's acknowledgement
    /// latencies.
    Report(crate::report::ReportArgs),
    /// The database going back in time (scripts/failover.sh, scripts/restore.sh): the
    /// record-by-record check and the runs' reports.
    Recovery(crate::recovery::RecoveryArgs),
    /// Read Apache Kafka's tools' output or its brokers' logs on stdin: lag 0, committed and end
    /// offsets, ISR changes.
    Kafka(crate::kafka_output::KafkaArgs),
    /// scripts/replay-compare.sh: collect replay runs with their round, and their table.
    ReplayCompare(crate::replay_compare::ReplayCompareArgs),
    /// The table of scripts/group-protocol-compare.sh (README.md).
    GroupProtocolReport(crate::group_protocol::GroupProtocolArgs),
    /// The processor's log lines of a broker outage, counted (scripts/outage-lines.sh).
    OutageLines(crate::outage_lines::OutageLinesArgs),
    /// Read values out of a JSON document (`json get FILE PATH…`).
    Json(crate::json_get::JsonArgs),
    /// The soak (scripts/loadtest.sh --soak): `soak watch` samples a running processor and its
    /// database once a minute; `soak report` writes the table and the plot per minute.
    Soak(crate::soak::SoakArgs),
}

/// `best-rate` flags.
#[derive(Debug, Clone, Args)]
pub struct BestRateArgs {
    /// Directory of run reports (`runs/*.json`).
    #[arg(long)]
    pub runs: std::path::PathBuf,
    /// Reports whose file name starts with this (`batched-b`).
    #[arg(long)]
    pub prefix: String,
    /// Printed when no report has the prefix.
    #[arg(long, value_name = "MSGS_PER_S")]
    pub or: Option<u64>,
}

/// `summary` flags.
#[derive(Debug, Clone, Args)]
pub struct SummaryArgs {
    /// Directory with `machine.json` and `runs/*.json`.
    #[arg(long)]
    pub input: std::path::PathBuf,
    /// Directory to write `summary.md`, `throughput.svg`, `latency-distribution.svg` and
    /// `latency-vs-rate.svg` to.
    #[arg(long)]
    pub output: std::path::PathBuf,
}

/// `copy-ceiling` flags.
#[derive(Debug, Clone, Args)]
pub struct CopyCeilingArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: DbArgs,
    /// Parallel COPY streams (one per partition of the source inbox, like the processor).
    #[arg(long, default_value_t = 8)]
    pub streams: usize,
    /// Write the measurement as a run report (JSON) to this file.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// `verify` flags.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: DbArgs,
    /// The JSON file written by `produce --expect`.
    #[arg(long)]
    pub expect: std::path::PathBuf,
}

/// Input shape of `produce` and `demo`.
#[derive(Debug, Clone, Args)]
pub struct GeneratorArgs {
    /// Records to write, duplicates and bad input included.
    #[arg(long, default_value_t = 100_000)]
    pub messages: u64,
    /// Number of accounts.
    #[arg(long, default_value_t = 1_000)]
    pub accounts: u64,
    /// Share of records that re-send an earlier id.
    #[arg(long, default_value_t = 0.1, value_parser = parse_ratio)]
    pub duplicate_ratio: f64,
    /// Share of records that are bad input (every kind in turn).
    #[arg(long, default_value_t = 0.01, value_parser = parse_ratio)]
    pub bad_ratio: f64,
    /// Share of new records that are debits.
    #[arg(long, default_value_t = 0.3, value_parser = parse_ratio)]
    pub debit_ratio: f64,
    /// UUID version of the ids: 4 (random) or 7 (time-ordered).
    #[arg(long, default_value_t = 7, value_parser = parse_id_version)]
    pub id_version: u8,
    /// Seed, for a reproducible input.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How records spread over accounts (keys).
    #[arg(long, value_enum, default_value_t = KeyDistribution::Uniform)]
    pub keys: KeyDistribution,
}

/// `produce` flags.
#[derive(Debug, Clone, Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub generator: GeneratorArgs,
    /// Partitions of the topic when it has to be created.
    #[arg(long, default_value_t = 8)]
    pub partitions: i32,
    /// What valid records' values are wrapped in: nothing (the entry itself), or a Kafka Connect
    /// JSON envelope (schema and payload, the payload with the record's id) for a Connect sink.
    /// The model is the same.
    #[arg(long, value_enum, default_value_t = ValueEnvelope::Bare)]
    pub envelope: ValueEnvelope,
    /// Write the expected outcome (counts, balances) as JSON to this file.
    #[arg(long)]
    pub expect: Option<std::path::PathBuf>,
    /// Records per second, at a constant rate (each record's timestamp is its intended send
    /// time); unlimited when absent.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Write the acknowledgement latency (each record's timestamp to the broker's
    /// acknowledgement, ms percentiles) as JSON to this file.
    #[arg(long)]
    pub ack_report: Option<std::path::PathBuf>,
}

/// `demo` flags.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// A PostgreSQL server where the demo may create its own database (this URL's database is
    /// only used to create and drop the demo's; nothing in it is read or written).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub server_url: String,
    /// Keep the demo's database afterwards (it is dropped by default).
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub generator: GeneratorArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub pipeline: PipelineArgs,
    /// Partitions of the demo topic.
    #[arg(long, default_value_t = 8)]
    pub partitions: i32,
}

fn parse_id_version(s: &str) -> Result<u8, String> {
    match s {
        "4" => Ok(4),
        "7" => Ok(7),
        _ => Err(format!("expected 4 or 7, got {s:?}")),
    }
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("expected a number from 0 to 1, got {s:?}")),
    }
}

impl GeneratorArgs {
    /// Generator settings from the flags.
    pub fn settings(&self) -> GeneratorSettings {
        GeneratorSettings {
            messages: self.messages,
            accounts: self.accounts,
            duplicate_ratio: self.duplicate_ratio,
            bad_ratio: self.bad_ratio,
            debit_ratio: self.debit_ratio,
            id_version: self.id_version,
            seed: self.seed,
            keys: self.keys,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_flags_are_refused_with_a_reason() {
        for (args, needle) in [
            (vec!["produce", "--duplicate-ratio", "1.5"], "from 0 to 1"),
            (vec!["produce", "--id-version", "5"], "4 or 7"),
            (
                vec!["drain", "--label", "x", "--report", "r.json"],
                "<COMMAND>",
            ),
        ] {
            let argv = std::iter::once("batch-inbox-bench").chain(args.iter().copied());
            let err = Cli::try_parse_from(argv).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }
}

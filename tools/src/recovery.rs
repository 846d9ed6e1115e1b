//! The database going back in time (`scripts/failover.sh`, `scripts/restore.sh`): the
//! `recovery` subcommand. [`check`]: the recovered database against the topic, record by record
//! (what was lost and where, whether anything was applied twice); [`report`]: the run's
//! `NAME.json` and `NAME.md` from the script's readings, the model, `verify`'s verdict, the
//! check and the processor's log.

pub mod check;
pub mod report;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use report::{Common, Failover, FailoverReadings, LogCounts, Model, Restore, RestoreReadings};

/// `recovery` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RecoveryArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: RecoveryCommand,
}

/// `recovery` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum RecoveryCommand {
    /// Compare the database with the topic record by record, as JSON: lost ids and dead letters
    /// (where), ids not in the topic, and whether a replay of the inbox's own rows gives the
    /// database's balances (anything else was applied twice).
    Check(CheckArgs),
    /// Write a failover run's report (`--out`.json and .md) and print its summary.
    FailoverReport(FailoverArgs),
    /// Write a restore run's report (`--out`.json and .md) and print its summary.
    RestoreReport(RestoreArgs),
}

/// `recovery check` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The topic as Kafka's ConsoleConsumer printed it (partition, offset, headers, key, value;
    /// a null value as NULL).
    #[arg(long)]
    pub topic_dump: PathBuf,
    /// The recovered database.
    #[arg(long)]
    pub database_url: String,
    /// The topic's name in the inbox and dead letters.
    #[arg(long)]
    pub topic: String,
    /// Write the JSON here; stdout otherwise.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// What every recovery report reads and begins with.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// The report's path without its extension (`.json` and `.md` are written).
    #[arg(long)]
    pub out: PathBuf,
    /// The model (`produce --expect`).
    #[arg(long)]
    pub expected: PathBuf,
    /// `verify`'s output.
    #[arg(long)]
    pub verify_log: PathBuf,
    /// `recovery check`'s JSON.
    #[arg(long)]
    pub check: PathBuf,
    /// The processor's log (its WARN lines about the database going back are counted).
    #[arg(long)]
    pub processor_log: PathBuf,
    /// The run's name.
    #[arg(long)]
    pub run: String,
    /// The generator's seed.
    #[arg(long)]
    pub seed: u64,
    /// Input records.
    #[arg(long)]
    pub messages: u64,
    /// Input records per second.
    #[arg(long)]
    pub rate: u64,
    /// The processor under test.
    #[arg(long)]
    pub binary: String,
    /// The broker.
    #[arg(long)]
    pub broker: String,
    /// The server's `postgres --version`.
    #[arg(long)]
    pub postgres: String,
    /// `verify`'s verdict.
    #[arg(long, value_parser = ["PASS", "FAIL"])]
    pub verdict: String,
}

/// `recovery failover-report` flags: the script's readings.
#[derive(Debug, Clone, clap::Args)]
pub struct FailoverArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Replication: async or sync.
    #[arg(long, value_parser = ["async", "sync"])]
    pub mode: String,
    /// The replica's received LSN when its replication was cut (absent: not cut).
    #[arg(long)]
    pub cut_lsn: Option<String>,
    /// The primary's WAL position just before its kill.
    #[arg(long, default_value = "")]
    pub primary_lsn_at_kill: String,
    /// The primary's inbox rows, last read before its kill.
    #[arg(long)]
    pub primary_rows_before: i64,
    /// The primary's stored positions (sum of next offsets), last read before its kill.
    #[arg(long)]
    pub primary_positions_before: i64,
    /// The old primary's inbox rows at its kill (its data directory started again afterwards;
    /// absent when it did not start).
    #[arg(long)]
    pub primary_rows_at_kill: Option<i64>,
    /// The old primary's stored positions at its kill.
    #[arg(long)]
    pub primary_positions_at_kill: Option<i64>,
    /// The replica's inbox rows at its promotion.
    #[arg(long)]
    pub replica_rows: i64,
    /// The replica's stored positions at its promotion.
    #[arg(long)]
    pub replica_positions: i64,
    /// The final database's inbox rows.
    #[arg(long)]
    pub final_rows: i64,
    /// The final database's stored positions.
    #[arg(long)]
    pub final_positions: i64,
    /// Whether every record's position was stored on the promoted server in time.
    #[arg(long, action = clap::ArgAction::Set)]
    pub drained: bool,
    /// Seconds from the kill to the drain (or to the give-up).
    #[arg(long)]
    pub drain_s: i64,
    /// An exit status of the processor that ended by itself (repeatable, in order).
    #[arg(long = "exit", value_name = "STATUS")]
    pub exits: Vec<i32>,
    /// Restarts of the processor after those exits.
    #[arg(long, default_value_t = 0)]
    pub restarts: u64,
}

/// `recovery restore-report` flags: the script's readings.
#[derive(Debug, Clone, clap::Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// The backup: dump or pitr.
    #[arg(long, value_parser = ["dump", "pitr"])]
    pub backup: String,
    /// The point in time recovered to (pitr).
    #[arg(long)]
    pub recovery_target_time: Option<String>,
    /// Inbox rows when the backup was taken.
    #[arg(long)]
    pub backup_rows: i64,
    /// Stored positions when the backup was taken.
    #[arg(long)]
    pub backup_positions: i64,
    /// Inbox rows of the drained database, before the restore.
    #[arg(long)]
    pub rows_before_restore: i64,
    /// Inbox rows right after the restore.
    #[arg(long)]
    pub rows_after_restore: i64,
    /// Stored positions right after the restore.
    #[arg(long)]
    pub positions_after_restore: i64,
    /// Exit status of the processor's second run (--exit-on-eof).
    #[arg(long)]
    pub second_run_exit: i32,
    /// The final database's inbox rows.
    #[arg(long)]
    pub final_rows: i64,
    /// The final database's stored positions.
    #[arg(long)]
    pub final_positions: i64,
}

/// Runs a `recovery` subcommand.
pub async fn run(args: RecoveryArgs) -> Result<()> {
    match args.command {
        RecoveryCommand::Check(a) => {
            let dump = read_text(&a.topic_dump)?;
            let records = check::read_topic(&dump);
            let db = check::read_database(&a.database_url, &a.topic).await?;
            let json = serde_json::to_string(&check::check(&records, &db))?;
            match &a.out {
                Some(path) => std::fs::write(path, json + "\n")
                    .with_context(|| format!("writing {}", path.display())),
                None => {
                    println!("{json}");
                    Ok(())
                }
            }
        }
        RecoveryCommand::FailoverReport(a) => {
            let (common, model, log, check) = inputs(&a.common)?;
            let readings = FailoverReadings {
                mode: a.mode,
                cut_lsn: a.cut_lsn.filter(|l| !l.is_empty()),
                primary_lsn_at_kill: a.primary_lsn_at_kill,
                primary_rows_before: a.primary_rows_before,
                primary_positions_before: a.primary_positions_before,
                primary_rows_at_kill: a.primary_rows_at_kill,
                primary_positions_at_kill: a.primary_positions_at_kill,
                replica_rows: a.replica_rows,
                replica_positions: a.replica_positions,
                final_rows: a.final_rows,
                final_positions: a.final_positions,
                drained: a.drained,
                drain_s: a.drain_s,
                exits: a.exits,
                restarts: a.restarts,
            };
            let report = Failover::new(common, readings, model, log, check);
            write(&a.common.out, &report, &report.markdown())
        }
        RecoveryCommand::RestoreReport(a) => {
            let (common, model, log, check) = inputs(&a.common)?;
            let readings = RestoreReadings {
                backup: a.backup,
                recovery_target_time: a.recovery_target_time.filter(|t| !t.is_empty()),
                backup_rows: a.backup_rows,
                backup_positions: a.backup_positions,
                rows_before_restore: a.rows_before_restore,
                rows_after_restore: a.rows_after_restore,
                positions_after_restore: a.positions_after_restore,
                second_run_exit: a.second_run_exit,
                final_rows: a.final_rows,
                final_positions: a.final_positions,
            };
            let report = Restore::new(common, readings, model, log, check);
            write(&a.common.out, &report, &report.markdown())
        }
    }
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn inputs(a: &CommonArgs) -> Result<(Common, Model, LogCounts, check::Check)> {
    let expected = crate::verify::read_expected(&a.expected)?;
    let check: check::Check = serde_json::from_str(&read_text(&a.check)?)
        .with_context(|| format!("parsing {}", a.check.display()))?;
    let common = Common {
        run: a.run.clone(),
        seed: a.seed,
        messages: a.messages,
        rate: a.rate,
        binary: a.binary.clone(),
        broker: a.broker.clone(),
        postgres: a.postgres.clone(),
        verdict: a.verdict.clone(),
        verify: read_text(&a.verify_log)?.trim().to_owned(),
    };
    let log = LogCounts::of(&read_text(&a.processor_log)?);
    Ok((common, Model::from(&expected), log, check))
}

/// `OUT.json` (indented by two) and `OUT.md`, then the summary's lines after its title.
fn write(out: &Path, report: &impl serde::Serialize, markdown: &str) -> Result<()> {
    let with = |ext: &str| {
        let mut p = out.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    let (json, md) = (with(".json"), with(".md"));
    std::fs::write(&json, serde_json::to_vec_pretty(report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    std::fs::write(&md, markdown).with_context(|| format!("writing {}", md.display()))?;
    let body: Vec<&str> = markdown.split('\n').skip(2).collect();
    println!("{}", body.join("\n"));
    Ok(())
}

//! A load-test run's report: what the processor measured (its `--stats-file`, the product's
//! [`StatsReport`]) with what only the load test knows: the run's name, the input rate, whether
//! the database matched the model, the statements it cost, and for a fixed-rate run the
//! producer's acknowledgement latencies (`report merge-acks`).

use std::path::{Path, PathBuf};

use anyhow::Context;

use batch_inbox::stats_file::StatsReport;
use serde::{Deserialize, Serialize};

/// One run of the load test.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReport {
    /// Name of the configuration.
    pub label: String,
    /// What the processor measured.
    #[serde(flatten)]
    pub run: StatsReport,
    /// Producer rate for fixed-rate runs; `None` for a backlog drain.
    #[serde(default)]
    pub input_rate: Option<f64>,
    /// Whether the database matched the generator's model afterwards (`None`: not checked).
    #[serde(default)]
    pub verified: Option<bool>,
    /// Statements executed per record, from pg_stat_statements (`None`: not available). Each
    /// statement is one round trip.
    #[serde(default)]
    pub statements_per_msg: Option<f64>,
    /// CPU seconds of the PostgreSQL server's processes while the processor ran (`None`: the
    /// server is not on this machine). Read by `drain` around the processor alone, so the model
    /// check after it does not count.
    #[serde(default)]
    pub postgres_cpu_s: Option<f64>,
    /// Fixed-rate runs: per record, its timestamp to the broker's acknowledgement of it to the
    /// producer, in ms (`produce --ack-report`): the producer-and-broker part of the latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_ms: Option<batch_inbox::stats_file::Percentiles>,
}

impl std::ops::Deref for RunReport {
    type Target = StatsReport;

    fn deref(&self) -> &StatsReport {
        &self.run
    }
}

impl std::ops::DerefMut for RunReport {
    fn deref_mut(&mut self) -> &mut StatsReport {
        &mut self.run
    }
}

/// `report` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: ReportCommand,
}

/// `report` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ReportCommand {
    /// Put the producer's acknowledgement latencies (`produce --ack-report`) into a run's report
    /// as `acked_ms`, rewriting it in place.
    MergeAcks(MergeAcksArgs),
}

/// `report merge-acks` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct MergeAcksArgs {
    /// The run's report (`drain --report`).
    #[arg(long)]
    pub run: PathBuf,
    /// The producer's acknowledgement report (`produce --ack-report`).
    #[arg(long)]
    pub acks: PathBuf,
}

/// Runs a `report` subcommand.
pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    match &args.command {
        ReportCommand::MergeAcks(a) => {
            let read =
                |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
            let report = with_acks(&read(&a.run)?, &read(&a.acks)?)?;
            batch_inbox::internals::stats_file::write_atomically(&a.run, &report)
                .with_context(|| format!("writing {}", a.run.display()))
        }
    }
}

/// The run report `report` with `acked_ms` from the acknowledgement report `acks`.
pub fn with_acks(report: &[u8], acks: &[u8]) -> anyhow::Result<RunReport> {
    let mut report: RunReport = serde_json::from_slice(report).context("the run's report")?;
    report.acked_ms = Some(serde_json::from_slice(acks).context("the acknowledgement report")?);
    Ok(report)
}

/// Reads a stats file written by `batch-inbox run --stats-file`.
pub fn read_stats(path: &Path) -> std::io::Result<StatsReport> {
    let bytes = std::fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

/// The largest `msgs_per_sec` among the run reports in `dir` whose file name starts with
/// `prefix` (`batched-b`: the batch-size sweep, not `batched-natural-…`); `None` when there is
/// none.
pub fn best_rate(dir: &Path, prefix: &str) -> std::io::Result<Option<f64>> {
    let mut best: Option<f64> = None;
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(prefix) || !name.ends_with(".json") {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry.path())?).map_err(std::io::Error::other)?;
        let rate = value["msgs_per_sec"]
            .as_f64()
            .ok_or_else(|| std::io::Error::other(format!("{name}: no msgs_per_sec")))?;
        best = Some(best.map_or(rate, |b| b.max(rate)));
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_rate_is_the_largest_of_the_runs_of_the_prefix() {
        let dir = std::env::temp_dir().join(format!("best-rate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, rate) in [
            ("batched-b1.json", 900.5),
            ("batched-b1000.json", 41161.9),
            ("batched-natural-b1000.json", 99999.0),
            ("per-message.json", 5000.0),
        ] {
            std::fs::write(dir.join(name), format!(r#"{{"msgs_per_sec": {rate}}}"#)).unwrap();
        }
        assert_eq!(best_rate(&dir, "batched-b").unwrap(), Some(41161.9));
        assert_eq!(best_rate(&dir, "scale-p").unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn acks_join_a_report_as_its_last_key_and_the_rest_is_unchanged() {
        let mut run = RunReport {
            label: "latency-b1000-r50".into(),
            input_rate: Some(500.0),
            verified: Some(true),
            ..RunReport::default()
        };
        run.stats.records = 5000;
        let before = serde_json::to_vec_pretty(&run).unwrap();
        let acks = br#"{"count": 5000, "mean": 3.5, "p50": 3.1, "p90": 5.0, "p99": 9.9,
                        "p999": 12.0, "max": 20.5}"#;
        let after = serde_json::to_string_pretty(&with_acks(&before, acks).unwrap()).unwrap();
        let before = String::from_utf8(before).unwrap();
        let (head, tail) = after.split_once(",\n  \"acked_ms\"").unwrap();
        assert_eq!(format!("{head}\n}}"), before);
        assert!(tail.contains("\"p999\": 12.0"), "{tail}");
        // Merged twice, the same document.
        let again = with_acks(after.as_bytes(), acks).unwrap();
        assert_eq!(serde_json::to_string_pretty(&again).unwrap(), after);
    }

    #[test]
    fn a_report_or_acks_that_are_not_json_are_named() {
        let err = with_acks(b"{", b"{}").unwrap_err();
        assert!(format!("{err:#}").contains("the run's report"));
        let run = serde_json::to_vec(&RunReport::default()).unwrap();
        let err = with_acks(&run, b"[]").unwrap_err();
        assert!(format!("{err:#}").contains("acknowledgement"));
    }
}

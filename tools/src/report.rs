//! A load-test run's report: what the processor measured (its `--stats-file`, the product's
//! [`StatsReport`]) with what only the load test knows: the run's name, the input rate, whether
//! the database matched the model, and the statements it cost.

use std::path::Path;

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
}

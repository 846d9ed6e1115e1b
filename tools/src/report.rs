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

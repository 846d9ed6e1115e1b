//! `run --stats-file`: the run's [`StatsReport`] rewritten periodically while the processor runs,
//! and once more when it stops, for whoever watches a run from outside (the load test, the chaos
//! run, an operator's script).
//!
//! A process killed with SIGKILL writes no final file; with the periodic rewrite, it leaves its
//! counters as of the last interval. Invariant: the file is replaced atomically (written beside
//! it, then renamed), so a reader never sees half a report.
//!
//! These are the run report's types, for the tools that read it; a service embedding the
//! processor needs none of them ([`crate::Stats::snapshot`] reads the counters).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::observe::metrics::{cpu_seconds, peak_rss_mb};
pub use crate::observe::metrics::{Measured, Percentiles};
use crate::observe::stats::{Stats, StatsSnapshot};

/// The writer of a stats file.
#[derive(Debug)]
pub struct StatsFile {
    path: PathBuf,
    settings: RunSettings,
    stats: Arc<Stats>,
    task: JoinHandle<()>,
}

impl StatsFile {
    /// Writes `stats` to `path` now and every `every` until [`StatsFile::finish`].
    pub fn start(path: PathBuf, settings: RunSettings, stats: Arc<Stats>, every: Duration) -> Self {
        let (p, s, st) = (path.clone(), settings.clone(), stats.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = write(&p, &s, &st) {
                    tracing::warn!("cannot write the stats file {}: {e}", p.display());
                }
            }
        });
        Self {
            path,
            settings,
            stats,
            task,
        }
    }

    /// Stops the periodic rewrite, waits until a rewrite in progress is done (an abort cannot
    /// stop a blocking write halfway, and two writers would share the temporary file: the second
    /// rename would find it gone), then writes the final report.
    pub async fn finish(self) -> std::io::Result<()> {
        self.task.abort();
        let _ = self.task.await;
        write(&self.path, &self.settings, &self.stats)
    }
}

fn write(path: &Path, settings: &RunSettings, stats: &Stats) -> std::io::Result<()> {
    write_atomically(path, &StatsReport::of(settings.clone(), stats))
}

/// The settings a run was made with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    /// `batched`, `per-message` or `consume-only`.
    pub mode: String,
    /// Most records per batch.
    pub batch_size: u64,
    /// Batch linger in milliseconds.
    pub linger_ms: u64,
    /// Database connections.
    pub pool_size: u64,
    /// The handler of `run`: `ledger` or `sql`; empty when there is none (consume-only) or the
    /// file predates the field.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub handler: String,
}

/// What a run measured: the format of `run --stats-file` (documented in docs/OPERATIONS.md;
/// fields are only ever added).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatsReport {
    /// The format's version, [`StatsReport::FORMAT`].
    #[serde(default)]
    pub format: u32,
    /// The run's settings.
    #[serde(default)]
    pub settings: RunSettings,
    /// Counters.
    pub stats: StatsSnapshot,
    /// Records per second over the window.
    pub msgs_per_sec: f64,
    /// Latencies, batch sizes and the throughput window (empty unless the stats were made
    /// with [`Stats::with_report`]).
    #[serde(flatten)]
    pub measured: Measured,
    /// Peak resident memory of the process.
    pub peak_rss_mb: f64,
    /// CPU time of the process (user + system), in seconds.
    #[serde(default)]
    pub cpu_s: f64,
}

impl StatsReport {
    /// The current format version.
    pub const FORMAT: u32 = 1;

    /// The report of `stats` now, for a run with `settings`.
    pub fn of(settings: RunSettings, stats: &Stats) -> Self {
        let counters = stats.snapshot();
        let measured = stats.measured().unwrap_or_default();
        let secs = measured.window_s;
        Self {
            format: Self::FORMAT,
            settings,
            stats: counters,
            msgs_per_sec: if secs > 0.0 {
                counters.records as f64 / secs
            } else {
                0.0
            },
            measured,
            peak_rss_mb: peak_rss_mb(),
            cpu_s: cpu_seconds(),
        }
    }
}

impl std::ops::Deref for StatsReport {
    type Target = Measured;

    fn deref(&self) -> &Measured {
        &self.measured
    }
}

impl std::ops::DerefMut for StatsReport {
    fn deref_mut(&mut self) -> &mut Measured {
        &mut self.measured
    }
}

/// Writes `value` as pretty JSON to `path` through a temporary file and a rename.
pub fn write_atomically(path: &Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[tokio::test]
    async fn the_report_is_rewritten_with_the_current_counters() {
        let dir = std::env::temp_dir().join(format!("bi-progress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("report.json");
        let stats = Arc::new(Stats::with_report());
        stats.records.store(7, Relaxed);
        let settings = RunSettings {
            mode: "batched".into(),
            ..RunSettings::default()
        };
        let writer = StatsFile::start(
            path.clone(),
            settings,
            stats.clone(),
            Duration::from_millis(5),
        );
        let read = |p: &Path| -> Option<StatsReport> {
            serde_json::from_slice(&std::fs::read(p).ok()?).ok()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while read(&path).map(|r| r.stats.records) != Some(7) {
            assert!(
                std::time::Instant::now() < deadline,
                "no report with 7 records"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stats.retries.store(3, Relaxed);
        while read(&path).map(|r| r.stats.retries) != Some(3) {
            assert!(
                std::time::Instant::now() < deadline,
                "the report was not rewritten"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stats.retries.store(4, Relaxed);
        writer.finish().await.expect("the final report");
        let report = read(&path).expect("a complete report");
        assert_eq!(
            (report.stats.retries, report.format),
            (4, StatsReport::FORMAT)
        );
        assert_eq!(report.settings.mode, "batched");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! `run --stats-file`: the run's [`StatsReport`] rewritten periodically while the processor runs,
//! and once more when it stops, for whoever watches a run from outside (the load test, the chaos
//! run, an operator's script).
//!
//! A process killed with SIGKILL writes no final file; with the periodic rewrite, it leaves its
//! counters as of the last interval. Invariant: the file is replaced atomically (written beside
//! it, then renamed), so a reader never sees half a report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::metrics::{RunSettings, StatsReport};
use crate::stats::Stats;

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

    /// Stops the periodic rewrite and writes the final report.
    pub fn finish(self) -> std::io::Result<()> {
        self.task.abort();
        write(&self.path, &self.settings, &self.stats)
    }
}

fn write(path: &Path, settings: &RunSettings, stats: &Stats) -> std::io::Result<()> {
    let report: StatsReport = stats.metrics.report(settings.clone(), stats.snapshot());
    write_atomically(path, &report)
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
        let stats = Arc::new(Stats::default());
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
        writer.finish().expect("the final report");
        let report = read(&path).expect("a complete report");
        assert_eq!(
            (report.stats.retries, report.format),
            (4, StatsReport::FORMAT)
        );
        assert_eq!(report.settings.mode, "batched");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

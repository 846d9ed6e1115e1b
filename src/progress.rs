//! A run's report rewritten periodically while the processor runs (`run --report-every-ms`).
//!
//! A process killed with SIGKILL writes no final report; with this, it leaves its counters as of
//! the last interval. Invariant: the file is replaced atomically (written beside it, then
//! renamed), so a reader never sees half a report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::stats::Stats;

/// Writes `stats` as a run report to `path` every `every`, until the task is aborted.
pub fn spawn_writer(
    path: PathBuf,
    label: String,
    stats: Arc<Stats>,
    every: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let report = stats.metrics.report(&label, stats.snapshot());
            if let Err(e) = write_atomically(&path, &report) {
                tracing::warn!("cannot write the progress report {}: {e}", path.display());
            }
        }
    })
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
        let writer = spawn_writer(
            path.clone(),
            "p".into(),
            stats.clone(),
            Duration::from_millis(5),
        );
        let read = |p: &Path| -> Option<crate::metrics::RunReport> {
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
        writer.abort();
        let report = read(&path).expect("a complete report");
        assert_eq!(report.label, "p");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

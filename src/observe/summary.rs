//! One summary line per interval at info level (nothing per message at info), from two
//! snapshots of the committed counters.
//!
//! Invariant: the figures add up to the run's totals: the `new`, `duplicates` and
//! `dead_letters` of all summary lines sum to what the processor committed in that time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::stats::{Stats, StatsSnapshot};

/// What happened between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Summary {
    /// Records committed per second.
    pub msgs_per_s: f64,
    /// Records committed.
    pub records: u64,
    /// New ids.
    pub new: u64,
    /// Duplicates skipped.
    pub duplicates: u64,
    /// Share of records that were duplicates (0 when there were none).
    pub dup_ratio: f64,
    /// Records dead-lettered (bad input and rejections).
    pub dead_letters: u64,
}

impl Summary {
    /// The difference from `before` to `after`, over `elapsed`.
    pub(crate) fn between(
        before: &StatsSnapshot,
        after: &StatsSnapshot,
        elapsed: Duration,
    ) -> Self {
        let records = after.records.saturating_sub(before.records);
        let duplicates = after.duplicates.saturating_sub(before.duplicates);
        let dead = |s: &StatsSnapshot| s.invalid + s.rejected;
        let secs = elapsed.as_secs_f64();
        Self {
            msgs_per_s: if secs > 0.0 {
                records as f64 / secs
            } else {
                0.0
            },
            records,
            new: after.new.saturating_sub(before.new),
            duplicates,
            dup_ratio: if records > 0 {
                duplicates as f64 / records as f64
            } else {
                0.0
            },
            dead_letters: dead(after).saturating_sub(dead(before)),
        }
    }
}

/// Logs a [`Summary`] every `every` until `stop` is cancelled, then one last line for the time
/// since the previous one (so the lines add up to the run's totals); does nothing when `every`
/// is 0.
pub(crate) async fn summary_loop(stats: Arc<Stats>, every: Duration, stop: CancellationToken) {
    if every.is_zero() {
        return;
    }
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await;
    let mut before = (stats.snapshot(), Instant::now());
    loop {
        let last = tokio::select! {
            _ = stop.cancelled() => true,
            _ = ticks.tick() => false,
        };
        let now = (stats.snapshot(), Instant::now());
        log_summary(
            &Summary::between(&before.0, &now.0, now.1 - before.1),
            &stats,
        );
        if last {
            return;
        }
        before = now;
    }
}

/// One summary line: at info level, or at warn level naming the unsafe test-only switches when
/// any is on, so that no summary of an unsafe run can be mistaken for a safe one.
fn log_summary(s: &Summary, stats: &Stats) {
    let (lag, partitions) = stats.total_lag();
    let switches = stats.unsafe_switches();
    macro_rules! summary {
        ($level:expr, $($unsafe:tt)*) => {
            tracing::event!(
                target: "batch_inbox::summary",
                $level,
                msgs_per_s = s.msgs_per_s.round() as u64,
                records = s.records,
                new = s.new,
                duplicates = s.duplicates,
                dup_ratio = (s.dup_ratio * 1000.0).round() / 1000.0,
                dead_letters = s.dead_letters,
                lag,
                lag_partitions = partitions,
                $($unsafe)*
            )
        };
    }
    if switches.is_empty() {
        summary!(tracing::Level::INFO, "summary");
    } else {
        let switches = switches.join(" ");
        summary!(
            tracing::Level::WARN,
            unsafe_mode = %switches,
            "summary; UNSAFE test-only mode ({switches}): the exactly-once guarantee does not hold"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_the_difference_of_two_snapshots() {
        let snapshot = |records, new, duplicates, invalid, rejected| {
            let mut s = StatsSnapshot::default();
            (s.records, s.new, s.duplicates) = (records, new, duplicates);
            (s.invalid, s.rejected) = (invalid, rejected);
            s
        };
        let before = snapshot(100, 80, 15, 3, 2);
        let after = snapshot(300, 230, 55, 10, 5);
        let s = Summary::between(&before, &after, Duration::from_secs(2));
        assert_eq!(
            (s.records, s.new, s.duplicates, s.dead_letters),
            (200, 150, 40, 10)
        );
        assert_eq!(s.msgs_per_s, 100.0);
        assert_eq!(s.dup_ratio, 0.2);
        let idle = Summary::between(&after, &after, Duration::from_secs(2));
        assert_eq!((idle.msgs_per_s, idle.dup_ratio), (0.0, 0.0));
    }
}

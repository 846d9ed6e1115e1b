//! Logs: human-readable text by default, one JSON object per line for log shippers, and one
//! summary line per interval at info level (nothing per message at info).
//!
//! The summary is computed from two snapshots of the committed counters, so its figures add up
//! to the run's totals: the `new`, `duplicates` and `dead_letters` of all summary lines sum to
//! what the processor committed in that time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::stats::{Stats, StatsSnapshot};

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}
crate::names::named!(LogFormat { Text = "text", Json = "json" });

/// Installs the global subscriber: `RUST_LOG` filters (default `info,rdkafka=warn`).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,rdkafka=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// The longest summary interval: a day.
pub const MAX_INTERVAL: Duration = Duration::from_secs(86_400);

/// Parses an interval: `10s`, `500ms`, `2m`, or a number of seconds; `0` turns it off. Longer
/// than [`MAX_INTERVAL`] is refused.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let too_long = || format!("{s:?} is longer than a day (1440m)");
    let n: u64 = match number.parse() {
        Ok(n) => n,
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => return Err(too_long()),
        Err(_) => {
            return Err(format!(
                "expected an interval like 10s, 500ms or 1m, got {s:?}"
            ))
        }
    };
    let interval = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_long)?),
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use ms, s or m")),
    };
    if interval > MAX_INTERVAL {
        return Err(too_long());
    }
    Ok(interval)
}

/// What happened between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
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
    pub fn between(before: &StatsSnapshot, after: &StatsSnapshot, elapsed: Duration) -> Self {
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
pub async fn summary_loop(stats: Arc<Stats>, every: Duration, stop: CancellationToken) {
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
    let (lag, partitions) = stats.telemetry.total_lag();
    let switches = stats.telemetry.unsafe_switches();
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
    fn intervals_take_a_unit() {
        assert_eq!(parse_interval("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_interval("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
        assert!(parse_interval("5h").unwrap_err().contains("unknown unit"));
        assert!(parse_interval("soon").is_err());
    }

    #[test]
    fn absurd_intervals_are_refused_not_overflowed() {
        assert_eq!(parse_interval("1440m"), Ok(MAX_INTERVAL));
        assert_eq!(parse_interval("86400"), Ok(MAX_INTERVAL));
        for absurd in [
            "1441m",
            "86401s",
            "86400001ms",
            "307445734561825861m", // times 60 overflows u64
            "18446744073709551615m",
            "99999999999999999999999s", // does not fit u64
        ] {
            let err = parse_interval(absurd).unwrap_err();
            assert!(err.contains("longer than a day"), "{absurd}: {err}");
        }
    }

    #[test]
    fn a_summary_is_the_difference_of_two_snapshots() {
        let before = StatsSnapshot {
            records: 100,
            new: 80,
            duplicates: 15,
            invalid: 3,
            rejected: 2,
            ..Default::default()
        };
        let after = StatsSnapshot {
            records: 300,
            new: 230,
            duplicates: 55,
            invalid: 10,
            rejected: 5,
            ..Default::default()
        };
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

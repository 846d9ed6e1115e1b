//! The flags of `migrate` and `cleanup`, the cleanup flags of `run`, and their validation into
//! [`RetentionSettings`].
//!
//! Every value is validated by the parser: a retention of zero or without a unit is refused with
//! a one-line reason.

use std::time::Duration;

use clap::Args;

use batch_inbox::internals::defaults;
use batch_inbox::retention::RetentionSettings;

/// How gently the cleanup works: shared by `cleanup` and `run --retention`.
#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    /// Most inbox rows one DELETE statement removes.
    #[arg(long, default_value_t = defaults::CLEANUP_BATCH_ROWS, value_parser = clap::value_parser!(i64).range(1..))]
    pub cleanup_batch_rows: i64,
    /// Pause between two DELETE statements, in milliseconds.
    #[arg(long, default_value_t = defaults::CLEANUP_PAUSE_MS)]
    pub cleanup_pause_ms: u64,
    /// lock_timeout of partition creates and drops, in milliseconds (retried when it expires).
    #[arg(long, default_value_t = defaults::LOCK_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub lock_timeout_ms: u64,
    /// Daily partitions created ahead of today (partitioned inbox; at most 366).
    #[arg(
        long,
        default_value_t = defaults::PARTITIONS_AHEAD,
        value_parser = clap::value_parser!(u32).range(..=i64::from(defaults::MAX_PARTITIONS_AHEAD))
    )]
    pub partitions_ahead: u32,
}

impl CleanupArgs {
    /// The settings for `retention`.
    pub fn settings(&self, retention: Duration) -> RetentionSettings {
        let mut settings = RetentionSettings::default();
        settings.retention = retention;
        settings.batch_rows = self.cleanup_batch_rows;
        settings.pause = Duration::from_millis(self.cleanup_pause_ms);
        settings.lock_timeout = Duration::from_millis(self.lock_timeout_ms);
        settings.partitions_ahead = self.partitions_ahead;
        settings
    }
}

/// `migrate` flags.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: super::args::DbArgs,
    /// Whose tables besides the core's (inbox, dead_letters, consumer_offsets): `ledger` (the
    /// ledger's balances too) or `sql` (none: the SQL handler's tables are the application's).
    #[arg(
        id = "handler",
        long = "handler",
        env = "BATCH_INBOX_HANDLER",
        value_enum,
        default_value_t = super::handler::HandlerKind::Ledger
    )]
    pub handler: super::handler::HandlerKind,
    /// Lay the inbox out in daily partitions by UUIDv7 time (converts a plain inbox in place,
    /// keeping every row; stop the processors first).
    #[arg(long)]
    pub partitioned: bool,
    /// Daily partitions created ahead of today (with --partitioned; at most 366).
    #[arg(
        long,
        default_value_t = defaults::PARTITIONS_AHEAD,
        value_parser = clap::value_parser!(u32).range(..=i64::from(defaults::MAX_PARTITIONS_AHEAD))
    )]
    pub partitions_ahead: u32,
}

/// `cleanup` flags.
#[derive(Debug, Clone, Args)]
pub struct CleanupCommandArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: super::args::DbArgs,
    /// Remove inbox rows older than this (`7d`, `36h`, `90m`, `600s`).
    #[arg(long, value_parser = parse_retention)]
    pub retention: Duration,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub cleanup: CleanupArgs,
}

/// Parses a retention such as `7d`, `36h`, `90m` or `600s` (a whole number and a unit).
pub fn parse_retention(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("expected a number and a unit (d, h, m, s), got {s:?}"))?;
    let seconds = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => {
            return Err(format!(
                "expected a unit d, h, m or s after the number, got {s:?}"
            ))
        }
    };
    match n.checked_mul(seconds) {
        Some(0) => Err("a retention must be longer than zero".to_owned()),
        Some(secs) => Ok(Duration::from_secs(secs)),
        None => Err(format!("{s:?} is too long")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retentions_parse_with_their_unit_and_bad_ones_say_why() {
        assert_eq!(parse_retention("7d"), Ok(Duration::from_secs(604_800)));
        assert_eq!(parse_retention("36h"), Ok(Duration::from_secs(129_600)));
        assert_eq!(parse_retention("90m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_retention("600s"), Ok(Duration::from_secs(600)));
        for (bad, why) in [
            ("7", "unit"),
            ("d", "number"),
            ("0d", "zero"),
            ("7w", "unit"),
        ] {
            let err = parse_retention(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}

//! The reports of `scripts/failover.sh` and `scripts/restore.sh`: `NAME.json` (the run's facts
//! from the script, the model, the verdict's text, the record-by-record check and the counts of
//! the processor's log) and `NAME.md` (its summary, printed too).
//!
//! Invariant: keys, their order and the Markdown lines are those of the committed reports in
//! `results/failover/`; the figures derived here (the gap, the log's counts) are computed from
//! the script's readings and the processor's log, never taken from the script's arithmetic.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::check::Check;
use crate::generate::Expected;

/// The model's counts a report names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    /// Records produced.
    pub records: u64,
    /// Distinct valid ids.
    pub new: u64,
    /// Valid records whose id was seen before.
    pub duplicates: u64,
    /// Dead letters by reason.
    pub dead_letters: BTreeMap<String, u64>,
}

impl From<&Expected> for Model {
    fn from(e: &Expected) -> Self {
        Self {
            records: e.records,
            new: e.new,
            duplicates: e.duplicates,
            dead_letters: e.dead_letters.clone(),
        }
    }
}

/// What the processor's log says about the database going back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogCounts {
    /// WARN lines saying the database's position went back: at assignment ("position is behind
    /// Kafka's committed offset"), while running ("went back", "reading again from the
    /// database"), or a partition the database knows nothing of ("holds no position").
    pub gap_warnings: u64,
    /// Records those WARN lines say are read again: their `behind=` and `gap=` fields, summed.
    pub records_rewound: u64,
    /// Lines with ` ERROR `.
    pub error_lines: u64,
    /// Lines that mention a retry or a backoff.
    pub retry_lines: u64,
}

impl LogCounts {
    /// The counts of a log's text.
    pub fn of(log: &str) -> Self {
        const GONE_BACK: [&str; 6] = [
            "position is behind",
            "went back",
            "back in time",
            "rewound",
            "reading again from the database",
            "holds no position",
        ];
        let mut c = Self::default();
        for line in log.lines() {
            let lower = line.to_lowercase();
            if line.contains("WARN") && GONE_BACK.iter().any(|p| lower.contains(p)) {
                c.gap_warnings += 1;
            }
            let plain = strip_colors(line);
            if plain.contains("WARN") {
                c.records_rewound = c.records_rewound.saturating_add(rewound_in(&plain));
            }
            if line.contains(" ERROR ") {
                c.error_lines += 1;
            }
            if lower.contains("retry") || lower.contains("backoff") {
                c.retry_lines += 1;
            }
        }
        c
    }
}

/// `line` without its terminal color sequences (`ESC [ digits ; … m`).
pub fn strip_colors(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("\x1b[") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let params = after
            .find(|c: char| !(c.is_ascii_digit() || c == ';'))
            .unwrap_or(after.len());
        if after[params..].starts_with('m') {
            rest = &after[params + 1..];
        } else {
            out.push_str("\x1b[");
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The sum of every `behind=N` and `gap=N` in `line`, left to right.
pub fn rewound_in(line: &str) -> u64 {
    let mut sum = 0u64;
    let mut rest = line;
    while !rest.is_empty() {
        let field = ["behind=", "gap="]
            .iter()
            .find(|f| rest.starts_with(**f))
            .map(|f| &rest[f.len()..])
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()));
        match field {
            Some(after) => {
                let end = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                sum = sum.saturating_add(after[..end].parse().unwrap_or(u64::MAX));
                rest = &after[end..];
            }
            None => {
                let next = rest.chars().next().map_or(1, char::len_utf8);
                rest = &rest[next..];
            }
        }
    }
    sum
}

/// The facts both reports begin with.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// The run's name (its files' stem).
    pub run: String,
    /// The generator's seed.
    pub seed: u64,
    /// Input records.
    pub messages: u64,
    /// Input records per second.
    pub rate: u64,
    /// The processor under test.
    pub binary: String,
    /// The broker.
    pub broker: String,
    /// `postgres --version`.
    pub postgres: String,
    /// PASS or FAIL.
    pub verdict: String,
    /// `verify`'s output.
    pub verify: String,
}

/// `failover-*.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[allow(missing_docs)]
pub struct Failover {
    pub run: String,
    pub mode: String,
    pub seed: u64,
    pub messages: u64,
    pub rate: u64,
    pub binary: String,
    pub broker: String,
    pub postgres: String,
    pub verdict: String,
    pub verify: String,
    pub model: Model,
    pub replication_cut: bool,
    pub replica_received_lsn_at_cut: Option<String>,
    pub primary_lsn_at_kill: String,
    pub primary_rows_last_read_before_kill: i64,
    pub primary_positions_last_read_before_kill: i64,
    pub primary_rows_at_kill: Option<i64>,
    pub primary_positions_at_kill: Option<i64>,
    pub replica_rows_at_promotion: i64,
    pub replica_positions_at_promotion: i64,
    /// The rows the promoted replica lacks: the old primary's at its kill (its last reading
    /// before when it could not be started again) less the replica's at promotion.
    pub gap_rows: i64,
    pub final_rows: i64,
    pub final_positions: i64,
    pub drained: bool,
    pub seconds_from_kill_to_drained: i64,
    pub processor_exits: Vec<i32>,
    pub processor_restarts: u64,
    pub processor_gap_warnings: u64,
    pub processor_records_rewound: u64,
    pub processor_error_lines: u64,
    pub processor_retry_lines: u64,
    pub check: Check,
}

/// The failover script's readings.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct FailoverReadings {
    pub mode: String,
    pub cut_lsn: Option<String>,
    pub primary_lsn_at_kill: String,
    pub primary_rows_before: i64,
    pub primary_positions_before: i64,
    pub primary_rows_at_kill: Option<i64>,
    pub primary_positions_at_kill: Option<i64>,
    pub replica_rows: i64,
    pub replica_positions: i64,
    pub final_rows: i64,
    pub final_positions: i64,
    pub drained: bool,
    pub drain_s: i64,
    pub exits: Vec<i32>,
    pub restarts: u64,
}

impl Failover {
    /// The report of a run.
    pub fn new(c: Common, r: FailoverReadings, model: Model, log: LogCounts, check: Check) -> Self {
        Self {
            run: c.run,
            mode: r.mode,
            seed: c.seed,
            messages: c.messages,
            rate: c.rate,
            binary: c.binary,
            broker: c.broker,
            postgres: c.postgres,
            verdict: c.verdict,
            verify: c.verify,
            model,
            replication_cut: r.cut_lsn.is_some(),
            replica_received_lsn_at_cut: r.cut_lsn,
            primary_lsn_at_kill: r.primary_lsn_at_kill,
            primary_rows_last_read_before_kill: r.primary_rows_before,
            primary_positions_last_read_before_kill: r.primary_positions_before,
            primary_rows_at_kill: r.primary_rows_at_kill,
            primary_positions_at_kill: r.primary_positions_at_kill,
            replica_rows_at_promotion: r.replica_rows,
            replica_positions_at_promotion: r.replica_positions,
            gap_rows: r.primary_rows_at_kill.unwrap_or(r.primary_rows_before) - r.replica_rows,
            final_rows: r.final_rows,
            final_positions: r.final_positions,
            drained: r.drained,
            seconds_from_kill_to_drained: r.drain_s,
            processor_exits: r.exits,
            processor_restarts: r.restarts,
            processor_gap_warnings: log.gap_warnings,
            processor_records_rewound: log.records_rewound,
            processor_error_lines: log.error_lines,
            processor_retry_lines: log.retry_lines,
            check,
        }
    }

    /// The Markdown summary.
    pub fn markdown(&self) -> String {
        let mut lines = head(&self.run, &self.verdict, &self.verify);
        lines.push(input_line(self.messages, self.rate, self.seed, &self.model));
        lines.push(format!(
            "- replication: {}{}",
            self.mode,
            match (&self.replica_received_lsn_at_cut, self.replication_cut) {
                (Some(lsn), true) => format!(", cut at {lsn}"),
                _ => String::new(),
            }
        ));
        lines.push(format!(
            "- inbox rows: primary at kill {}, replica at promotion {}, gap {}; final {} (model {})",
            py_opt(self.primary_rows_at_kill),
            self.replica_rows_at_promotion,
            self.gap_rows,
            self.final_rows,
            self.model.new
        ));
        lines.extend(check_lines(&self.check));
        lines.push(format!(
            "- processor: {} restarts, {} WARN lines about the database going back (records \
             read again: {}), {} ERROR lines; drained {} ({} s after the kill)",
            self.processor_restarts,
            self.processor_gap_warnings,
            self.processor_records_rewound,
            self.processor_error_lines,
            py_bool(self.drained),
            self.seconds_from_kill_to_drained
        ));
        lines.push(tail(&self.binary, &self.postgres, &self.broker));
        lines.push(String::new());
        lines.join("\n")
    }
}

/// `restore-*.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[allow(missing_docs)]
pub struct Restore {
    pub run: String,
    pub backup: String,
    pub seed: u64,
    pub messages: u64,
    pub rate: u64,
    pub binary: String,
    pub broker: String,
    pub postgres: String,
    pub verdict: String,
    pub verify: String,
    pub model: Model,
    pub recovery_target_time: Option<String>,
    pub rows_when_backed_up: i64,
    pub positions_when_backed_up: i64,
    pub rows_before_restore: i64,
    pub rows_after_restore: i64,
    pub positions_after_restore: i64,
    /// The rows the restore took away: those before it less those after it.
    pub gap_rows: i64,
    pub second_run_exit: i32,
    pub final_rows: i64,
    pub final_positions: i64,
    pub processor_gap_warnings: u64,
    pub processor_records_rewound: u64,
    pub check: Check,
}

/// The restore script's readings.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct RestoreReadings {
    pub backup: String,
    pub recovery_target_time: Option<String>,
    pub backup_rows: i64,
    pub backup_positions: i64,
    pub rows_before_restore: i64,
    pub rows_after_restore: i64,
    pub positions_after_restore: i64,
    pub second_run_exit: i32,
    pub final_rows: i64,
    pub final_positions: i64,
}

impl Restore {
    /// The report of a run.
    pub fn new(c: Common, r: RestoreReadings, model: Model, log: LogCounts, check: Check) -> Self {
        Self {
            run: c.run,
            backup: r.backup,
            seed: c.seed,
            messages: c.messages,
            rate: c.rate,
            binary: c.binary,
            broker: c.broker,
            postgres: c.postgres,
            verdict: c.verdict,
            verify: c.verify,
            model,
            recovery_target_time: r.recovery_target_time,
            rows_when_backed_up: r.backup_rows,
            positions_when_backed_up: r.backup_positions,
            rows_before_restore: r.rows_before_restore,
            rows_after_restore: r.rows_after_restore,
            positions_after_restore: r.positions_after_restore,
            gap_rows: r.rows_before_restore - r.rows_after_restore,
            second_run_exit: r.second_run_exit,
            final_rows: r.final_rows,
            final_positions: r.final_positions,
            processor_gap_warnings: log.gap_warnings,
            processor_records_rewound: log.records_rewound,
            check,
        }
    }

    /// The Markdown summary.
    pub fn markdown(&self) -> String {
        let mut lines = head(&self.run, &self.verdict, &self.verify);
        lines.push(input_line(self.messages, self.rate, self.seed, &self.model));
        lines.push(format!(
            "- backup: {}{}",
            self.backup,
            self.recovery_target_time
                .as_ref()
                .map_or(String::new(), |t| format!(" to {t}"))
        ));
        lines.push(format!(
            "- inbox rows: {} before the restore, {} after it (gap {}); final {} (model {})",
            self.rows_before_restore,
            self.rows_after_restore,
            self.gap_rows,
            self.final_rows,
            self.model.new
        ));
        lines.extend(check_lines(&self.check));
        lines.push(format!(
            "- processor: second run (--exit-on-eof) exit {}; {} WARN lines about the database \
             going back (records read again: {})",
            self.second_run_exit, self.processor_gap_warnings, self.processor_records_rewound
        ));
        lines.push(tail(&self.binary, &self.postgres, &self.broker));
        lines.push(String::new());
        lines.join("\n")
    }
}

fn head(run: &str, verdict: &str, verify: &str) -> Vec<String> {
    let why = if verdict == "PASS" {
        "exactly the model"
    } else {
        verify.lines().last().unwrap_or("")
    };
    vec![
        format!("# {run}"),
        String::new(),
        format!("- verdict: **{verdict}** ({why})"),
    ]
}

fn input_line(messages: u64, rate: u64, seed: u64, m: &Model) -> String {
    format!(
        "- input: {messages} records at {rate}/s, seed {seed}; model: {} valid ids, {} \
         duplicates, dead letters {}",
        m.new,
        m.duplicates,
        py_dict(&m.dead_letters)
    )
}

fn check_lines(c: &Check) -> [String; 2] {
    [
        format!(
            "- lost: {} valid ids ({}); {} dead letters",
            c.lost_valid_ids,
            c.lost_valid_where.join("; "),
            c.lost_dead_letters
        ),
        format!(
            "- applied twice: {} (balances differing from a replay of the inbox's own rows: {})",
            if c.applied_twice { "YES" } else { "no" },
            c.balances_differing_from_inbox_replay
        ),
    ]
}

fn tail(binary: &str, postgres: &str, broker: &str) -> String {
    format!("- binary: {binary}; {postgres}; {broker}")
}

// The committed summaries were written by Python: its spelling of a dict, a boolean and None
// is kept, so that old and new summaries read (and diff) alike.

/// `{'empty_payload': 60, 'invalid_id': 30}`.
pub fn py_dict(m: &BTreeMap<String, u64>) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in m.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let _ = write!(s, "{sep}'{k}': {v}");
    }
    s.push('}');
    s
}

/// `True` or `False`.
pub fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The number, or `None`.
pub fn py_opt(n: Option<i64>) -> String {
    n.map_or("None".to_owned(), |n| n.to_string())
}

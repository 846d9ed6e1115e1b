//! The sections beside the main tables: the database-only replay against the drains at the same
//! batch size, the scale-out runs, and the remote-database runs.

use std::path::Path;

use serde::Deserialize;

use super::cpu::{postgres_us_per_record, Samples};
use super::{batch_cell, header, int, io_err, row, trusted, SummaryError, DASH};
use crate::report::RunReport;

/// The figures of one `batch-inbox-bench replay` run that the summary uses.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Replay {
    pub(super) label: String,
    pub(super) mode: String,
    pub(super) batch_size: u64,
    pub(super) records_per_s: f64,
    #[serde(default)]
    pub(super) pg_cpu_us_per_record: Option<f64>,
    #[serde(default)]
    pub(super) differences: Vec<String>,
}

impl Replay {
    /// Batched, and its database matched the model.
    pub(super) fn usable(&self) -> bool {
        self.mode.eq_ignore_ascii_case("batched") && self.differences.is_empty()
    }
}

/// The replay reports, one JSON object a line; none when the file is absent.
pub(super) fn read_replays(path: &Path) -> Result<Vec<Replay>, SummaryError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(path)(e)),
    };
    let lines = text.lines().filter(|l| !l.trim().is_empty());
    let parse = |l: &str| {
        serde_json::from_str(l).map_err(|source| SummaryError::Json {
            path: path.into(),
            source,
        })
    };
    lines.map(parse).collect()
}

/// The fastest trusted main batched drain at `size` records per batch (linger or natural).
pub(super) fn drain_at(runs: &[RunReport], size: u64) -> Option<&RunReport> {
    let keep = |r: &&RunReport| {
        r.label.starts_with("batched-") && trusted(r) && r.settings.batch_size == size
    };
    let runs = runs.iter().filter(keep);
    runs.max_by(|a, b| a.msgs_per_sec.total_cmp(&b.msgs_per_sec))
}

pub(super) fn replay(runs: &[RunReport], replays: &[Replay]) -> String {
    if replays.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Database-only replay (the same work without Kafka)\n\n");
    md.push_str("The same records, batches, statements and handler, driven from memory by ");
    md.push_str("`batch-inbox-bench replay` on the same server; the drain at the same batch size ");
    md.push_str("beside it.\n");
    header(
        &mut md,
        "replay|batch size|records/s|PostgreSQL µs per record|verified|drain msgs/s|drain % of replay",
    );
    for r in replays {
        let drain = drain_at(runs, r.batch_size);
        row(
            &mut md,
            &[
                r.label.clone(),
                r.batch_size.to_string(),
                int(r.records_per_s),
                r.pg_cpu_us_per_record
                    .map_or(DASH.into(), |v| format!("{v:.2}")),
                if r.differences.is_empty() {
                    "yes"
                } else {
                    "no"
                }
                .into(),
                drain.map_or(DASH.into(), |d| int(d.msgs_per_sec)),
                drain.map_or(DASH.into(), |d| {
                    format!("{:.1}%", d.msgs_per_sec / r.records_per_s * 100.0)
                }),
            ],
        );
    }
    md
}

pub(super) fn scale_out(runs: &[RunReport], samples: &Samples) -> String {
    let scaled: Vec<&RunReport> = runs
        .iter()
        .filter(|r| r.label.starts_with("scale-p"))
        .collect();
    if scaled.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Scale-out (processes in one consumer group)\n\n");
    md.push_str("N processes of `batch-inbox run` in one group drain the main input together; ");
    md.push_str("msgs/s is counted from the first start to the last exit (group joins and ");
    md.push_str("rebalances included), so the runs compare with each other, not with the drains ");
    md.push_str("above. CPU per record is summed over the processes.\n");
    header(
        &mut md,
        "configuration|processes|batch size|records|msgs/s|processor µs per record|PostgreSQL µs per record|transactions|verified",
    );
    for r in scaled {
        let n = r.label.trim_start_matches("scale-p");
        let records = r.stats.records.max(1) as f64;
        row(
            &mut md,
            &[
                r.label.clone(),
                n.into(),
                batch_cell(r),
                int(r.stats.records as f64),
                int(r.msgs_per_sec),
                format!("{:.1}", r.cpu_s / records * 1e6),
                postgres_us_per_record(samples, r).map_or(DASH.into(), |v| format!("{v:.1}")),
                int(r.stats.transactions as f64),
                verified(r).into(),
            ],
        );
    }
    md
}

fn verified(r: &RunReport) -> &'static str {
    r.verified.map_or(DASH, |v| if v { "yes" } else { "no" })
}

/// The delay of a `remote-<delay>ms-…` label.
fn delay_of(r: &RunReport) -> Option<&str> {
    r.label.strip_prefix("remote-")?.split("ms-").next()
}

pub(super) fn remote(runs: &[RunReport]) -> String {
    let remote: Vec<&RunReport> = runs.iter().filter(|r| delay_of(r).is_some()).collect();
    if remote.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Remote database (a delaying proxy in front of PostgreSQL)\n\n");
    md.push_str("`batch-inbox-bench delay-proxy` adds the delay to every byte in each direction, ");
    md.push_str("so each round trip costs twice the delay more: per message in the baseline, per ");
    md.push_str("batch in the batched mode. A smaller input of its own (`remote.expected`).\n");
    header(
        &mut md,
        "delay each way ms|per-message msgs/s|batched msgs/s|batch size|× per-message|verified",
    );
    let mut delays: Vec<&str> = remote.iter().filter_map(|r| delay_of(r)).collect();
    delays.sort_by(|a, b| {
        a.parse::<f64>()
            .ok()
            .partial_cmp(&b.parse::<f64>().ok())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    delays.dedup();
    for delay in delays {
        let of = |mode: &str| {
            remote
                .iter()
                .find(|r| delay_of(r) == Some(delay) && r.settings.mode == mode)
        };
        let (base, batched) = (of("per-message"), of("batched"));
        let rate = |r: Option<&&RunReport>| r.map_or(DASH.into(), |r| int(r.msgs_per_sec));
        let ratio = match (base, batched) {
            (Some(b), Some(x)) if b.msgs_per_sec > 0.0 => {
                format!("{:.1}×", x.msgs_per_sec / b.msgs_per_sec)
            }
            _ => DASH.into(),
        };
        let all = [base, batched].into_iter().flatten();
        let ok = all.clone().all(|r| r.verified == Some(true));
        row(
            &mut md,
            &[
                delay.into(),
                rate(base),
                rate(batched),
                batched.map_or(DASH.into(), |r| batch_cell(r)),
                ratio,
                if ok { "yes" } else { "no" }.into(),
            ],
        );
    }
    md
}

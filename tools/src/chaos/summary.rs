//! `chaos summary DIR`: one Markdown table of every chaos run report (`chaos-*.json`) in a
//! directory, with the brokers' replication account beside each (`isr-chaos-*.json`, written by
//! `scripts/chaos.sh` for a cluster), and the totals (`scripts/chaos-campaign.sh` writes it to
//! `summary.md`).
//!
//! Invariant: reports of every version in `results/chaos/` are read: a count a report lacks
//! (written before it existed) is 0, and the table is the one the campaigns committed (a
//! number the report wrote as a float is shown to 0.1, an integer as it is).

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

/// `chaos summary` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SummaryArgs {
    /// The directory of the chaos-*.json reports.
    pub dir: PathBuf,
}

/// A cell's number: an integer, or a float as the report wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
}

impl Num {
    fn of(v: Option<&Value>) -> Self {
        match v {
            Some(Value::Number(n)) if n.is_f64() => Num::Float(n.as_f64().unwrap_or(0.0)),
            Some(Value::Number(n)) => Num::Int(n.as_i64().unwrap_or(i64::MAX)),
            Some(Value::String(s)) => s.parse().map_or(Num::Int(0), Num::Int),
            _ => Num::Int(0),
        }
    }

    fn f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    fn add(self, other: Num) -> Num {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Num::Int(a.saturating_add(b)),
            (a, b) => Num::Float(a.f64() + b.f64()),
        }
    }

    /// A table cell: a float to 0.1, an integer as it is.
    fn cell(self) -> String {
        match self {
            Num::Int(i) => i.to_string(),
            Num::Float(f) => format!("{f:.1}"),
        }
    }

    /// A total: an integer as it is, a float as Python's `str` spells a whole one (`3.0`).
    fn total(self) -> String {
        match self {
            Num::Int(i) => i.to_string(),
            Num::Float(f) if f.fract() == 0.0 && f.abs() < 1e16 => format!("{f:.1}"),
            Num::Float(f) => f.to_string(),
        }
    }
}

/// The counted columns, in the table's order after seed, duration_s and verdict.
pub const COUNTS: [&str; 19] = [
    "records",
    "kill",
    "pause",
    "restart_db",
    "restart_broker",
    "failover",
    "rewound",
    "isr_shrinks",
    "isr_rejoins",
    "under_replicated_end",
    "join",
    "leave",
    "moves",
    "retries",
    "replayed",
    "avoided",
    "gaps",
    "regressions",
    "drained_s",
];

/// One run's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The report's file name.
    pub file: String,
    /// Its seed.
    pub seed: Num,
    /// Its fault phase, s.
    pub duration_s: Num,
    /// Its verdict, with the invariants that failed.
    pub verdict: String,
    /// Every invariant held.
    pub passed: bool,
    /// A control run (an unsafe configuration).
    pub control: bool,
    /// The counts, in [`COUNTS`]' order.
    pub counts: [Num; 19],
    /// The broker, as the report names it.
    pub broker: String,
    /// The group protocol.
    pub protocol: String,
}

/// The row of report `r` (file name `file`) with the brokers' replication account `isr`
/// (`Value::Null` when there is none).
pub fn row(file: &str, r: &Value, isr: &Value) -> Row {
    let at = |v: &Value, k: &str| Num::of(v.get(k));
    let (f, p, rp) = (&r["faults"], &r["processors"], &r["replays"]);
    let failed: Vec<&str> = r["invariants"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter(|i| !i["ok"].as_bool().unwrap_or(false))
                .filter_map(|i| i["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let control = r["control"].as_bool().unwrap_or(false);
    let verdict = format!(
        "{}{}{}",
        if control { "control, caught: " } else { "" },
        r["verdict"].as_str().unwrap_or(""),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join(", "))
        }
    );
    let regressions = r["offsets"]["regressions"]
        .as_array()
        .map_or(0, |a| a.len() as i64);
    let drained = match r["throughput"].get("drained_after_s") {
        None => Num::Float(0.0),
        v => Num::of(v),
    };
    let text = |k: &str, default: &str| {
        r["setup"]
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_owned()
    };
    Row {
        file: file.to_owned(),
        seed: at(r, "seed"),
        duration_s: at(r, "duration_s"),
        verdict,
        passed: r["passed"].as_bool().unwrap_or(false),
        control,
        counts: [
            at(&r["setup"], "records"),
            at(f, "kill"),
            at(f, "pause"),
            at(f, "restart_db"),
            at(f, "restart_broker"),
            at(f, "failover"),
            at(p, "positions_rewound"),
            at(isr, "isr_shrinks"),
            at(isr, "isr_expansions"),
            at(isr, "under_replicated_partitions_at_end"),
            at(f, "join"),
            at(f, "leave"),
            at(p, "partition_moves"),
            at(r, "retries"),
            at(rp, "replayed_records"),
            at(rp, "replays_avoided"),
            at(p, "offset_gaps"),
            Num::Int(regressions),
            drained,
        ],
        broker: text("broker", ""),
        protocol: text("group_protocol", "classic"),
    }
}

/// The rows sorted by duration, seed and file name.
pub fn sort(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        a.duration_s
            .f64()
            .partial_cmp(&b.duration_s.f64())
            .unwrap_or(Ordering::Equal)
            .then(
                a.seed
                    .f64()
                    .partial_cmp(&b.seed.f64())
                    .unwrap_or(Ordering::Equal),
            )
            .then_with(|| a.file.cmp(&b.file))
    });
}

const COLUMNS_NOTE: &str = "Columns: faults injected (kill = SIGKILL, pause = SIGSTOP past the \
session timeout, restart_db = PostgreSQL stopped -m immediate, restart_broker = a Kafka node \
SIGKILLed and started again on its own log, failover = the replication to an asynchronous replica \
cut, the primary SIGKILLed seconds later and the replica promoted, rewound = partitions the \
processors read again from the database's position after it went back (WARN lines), isr_shrinks = \
a leader's ISR changes to fewer than all nodes in the brokers' logs (a replica that fell behind; \
the controller's removal of a fenced, killed node is not logged there), isr_rejoins = ISR changes \
back to all nodes (a replica caught up again, after either), under_replicated_end = partitions \
under-replicated after the run, join/leave = members added/removed), partition moves, transient \
retries, records replayed to a processor and replays avoided by the offsets in the database \
(lower bounds), offset gaps seen by the workers, committed-offset regressions seen by the watcher \
(after a failover: back to the promoted database's position, never below it), seconds until the \
group drained.";

const RABBITMQ_NOTE: &str = "On RabbitMQ: restart_broker = the node SIGKILLed and started again \
on its own data; a pause lasts past three AMQP heartbeats (the broker closes the paused \
processor's connection); moves = processes that applied records, beyond one (queues taken over \
by a standby after a kill, a pause, a leave or a broker restart, or split between the first \
processes); replayed = deliveries committed again (redelivered after a COMMIT whose ack was lost, \
or a publish the broker had not confirmed and received twice); regressions = a queue's position \
in the database moving backwards.";

const NATS_NOTE: &str = "On NATS JetStream: restart_broker = nats-server SIGKILLed and started \
again on its own file store; a pause lasts past the consumers' ack_wait and a standby's lock poll, \
and (unless --pause-ends-sessions=false) the database ends the paused processor's lock sessions; \
moves = stream takeovers (a stream's advisory lock seen held by another process than before); \
replayed = records committed beyond the streams' messages; avoided = the server's redeliveries \
(each consumer's delivery sequence minus its last stream sequence delivered), each acknowledged \
again below the database's position or left to the batch that held it; regressions = a stream's \
position in the database moving backwards.";

/// The Markdown of sorted `rows`.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Chaos runs ({})\n", rows.len());
    let setups: BTreeSet<(&str, &str)> = rows
        .iter()
        .map(|r| (r.broker.as_str(), r.protocol.as_str()))
        .collect();
    for (broker, protocol) in setups {
        let broker = if broker.is_empty() {
            "not recorded"
        } else {
            broker
        };
        let _ = writeln!(s, "- broker: {broker}; group protocol: {protocol}");
    }
    s.push('\n');
    let (controls, safe): (Vec<&Row>, Vec<&Row>) = rows.iter().partition(|r| r.control);
    let _ = writeln!(
        s,
        "{} of {} runs passed every invariant.",
        safe.iter().filter(|r| r.passed).count(),
        safe.len()
    );
    if !controls.is_empty() {
        let _ = writeln!(
            s,
            "{} of {} control runs (an unsafe configuration) failed it, as they must.",
            controls.iter().filter(|r| !r.passed).count(),
            controls.len()
        );
    }
    s.push('\n');
    let cols: Vec<&str> = ["seed", "duration_s", "verdict"]
        .into_iter()
        .chain(COUNTS)
        .collect();
    let _ = writeln!(s, "| {} |", cols.join(" | "));
    let _ = writeln!(s, "|{}", "---|".repeat(cols.len()));
    for r in rows {
        let cells: Vec<String> = [r.seed.cell(), r.duration_s.cell(), r.verdict.clone()]
            .into_iter()
            .chain(r.counts.iter().map(|n| n.cell()))
            .collect();
        let _ = writeln!(s, "| {} |", cells.join(" | "));
    }
    let duration: f64 = rows.iter().map(|r| r.duration_s.f64()).sum();
    // Every count but drained_s, the last.
    let totals: Vec<String> = (0..COUNTS.len() - 1)
        .map(|i| {
            rows.iter()
                .fold(Num::Int(0), |t, r| t.add(r.counts[i]))
                .total()
        })
        .collect();
    let _ = writeln!(s, "| total | {duration:.0} | | {} | |", totals.join(" | "));
    let _ = writeln!(s, "\n{COLUMNS_NOTE}");
    if rows.iter().any(|r| r.broker.starts_with("RabbitMQ")) {
        let _ = writeln!(s, "\n{RABBITMQ_NOTE}");
    }
    if rows.iter().any(|r| r.broker.starts_with("NATS")) {
        let _ = writeln!(s, "\n{NATS_NOTE}");
    }
    s
}

/// The summary of the reports in `dir`.
pub fn of_dir(dir: &Path) -> Result<String> {
    let mut rows = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("chaos-") && name.ends_with(".json")) {
            continue;
        }
        let read = |p: &Path| -> Result<Value> {
            let text = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_slice(&text).with_context(|| format!("parsing {}", p.display()))
        };
        let report = read(&entry.path())?;
        let isr_path = dir.join(format!("isr-{name}"));
        let isr = if isr_path.exists() {
            read(&isr_path)?
        } else {
            Value::Null
        };
        rows.push(row(&name, &report, &isr));
    }
    sort(&mut rows);
    Ok(markdown(&rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(seed: u64, duration: f64, control: bool, ok: bool) -> Value {
        json!({
            "verdict": if ok { "PASS" } else { "FAIL" }, "passed": ok, "seed": seed,
            "control": control, "duration_s": duration,
            "setup": {"records": "24000", "broker": "Apache Kafka 4.4.0, 3 node(s)"},
            "faults": {"kill": 2, "pause": 1, "restart_broker": 1},
            "invariants": [{"name": "lag_zero", "ok": true}, {"name": "inbox_ids", "ok": ok},
                           {"name": "every_balance", "ok": ok}],
            "processors": {"partition_moves": 6, "offset_gaps": 0, "positions_rewound": 1},
            "replays": {"replayed_records": 5, "replays_avoided": 88},
            "retries": 21,
            "throughput": {"drained_after_s": 33.56},
            "offsets": {"regressions": [{}, {}]},
        })
    }

    #[test]
    fn a_row_takes_the_counts_and_names_the_failed_invariants() {
        let isr = json!({"isr_shrinks": 3, "isr_expansions": 4});
        let r = row("chaos-1.json", &report(7, 30.0, true, false), &isr);
        assert_eq!(
            r.verdict,
            "control, caught: FAIL (inbox_ids, every_balance)"
        );
        assert!(r.control && !r.passed);
        assert_eq!(
            r.counts[0],
            Num::Int(24_000),
            "records, from the setup's text"
        );
        assert_eq!(
            &r.counts[1..5],
            &[Num::Int(2), Num::Int(1), Num::Int(0), Num::Int(1)]
        );
        assert_eq!(&r.counts[7..10], &[Num::Int(3), Num::Int(4), Num::Int(0)]);
        assert_eq!(r.counts[17], Num::Int(2), "regressions");
        assert_eq!(r.counts[18], Num::Float(33.56));
        assert_eq!(
            r.protocol, "classic",
            "a report without the protocol is classic"
        );
    }

    #[test]
    fn a_report_of_an_older_version_counts_what_it_lacks_as_zero() {
        let old = json!({"verdict": "PASS", "passed": true, "seed": 1, "duration_s": 60,
                         "setup": {"records": "100"}, "faults": {}, "processors": {},
                         "replays": {}, "invariants": [], "throughput": {}, "offsets": {}});
        let r = row("chaos-old.json", &old, &Value::Null);
        assert_eq!(r.verdict, "PASS");
        assert_eq!(r.duration_s, Num::Int(60));
        assert!(r.counts[1..18].iter().all(|n| *n == Num::Int(0)));
        assert_eq!(r.counts[18], Num::Float(0.0));
        assert_eq!(r.broker, "");
    }

    #[test]
    fn cells_show_floats_to_a_tenth_and_totals_as_python_spelled_them() {
        assert_eq!(Num::Float(33.56).cell(), "33.6");
        assert_eq!(Num::Int(7).cell(), "7");
        assert_eq!(Num::Int(2).add(Num::Float(1.0)).total(), "3.0");
        assert_eq!(Num::Int(2).add(Num::Int(1)).total(), "3");
    }

    #[test]
    fn rows_sort_by_duration_seed_and_file_and_the_table_has_totals() {
        let mut rows = vec![
            row("chaos-b.json", &report(2, 60.0, false, true), &Value::Null),
            row("chaos-a.json", &report(9, 30.0, true, false), &Value::Null),
            row("chaos-c.json", &report(1, 60.0, false, true), &Value::Null),
        ];
        sort(&mut rows);
        let files: Vec<&str> = rows.iter().map(|r| r.file.as_str()).collect();
        assert_eq!(files, ["chaos-a.json", "chaos-c.json", "chaos-b.json"]);
        let md = markdown(&rows);
        assert!(md.starts_with("# Chaos runs (3)\n\n- broker: Apache Kafka 4.4.0, 3 node(s); group protocol: classic\n\n"));
        assert!(md.contains("2 of 2 runs passed every invariant.\n1 of 1 control runs"));
        assert!(
            md.contains("\n| total | 150 | | 72000 | 6 | 3 | 0 | 3 |"),
            "{md}"
        );
        assert!(md.ends_with("seconds until the group drained.\n"));
    }

    #[test]
    fn a_rabbitmq_run_names_its_broker_and_explains_its_columns() {
        let mut r = report(3, 60.0, false, true);
        r["setup"]["broker"] = json!("RabbitMQ 3.10.8, 1 node, classic queues");
        r["setup"]["group_protocol"] = json!("single-active-consumer");
        let md = markdown(&[row("chaos-r.json", &r, &Value::Null)]);
        assert!(md.contains(
            "- broker: RabbitMQ 3.10.8, 1 node, classic queues; group protocol: single-active-consumer"
        ));
        assert!(md.trim_end().ends_with("moving backwards."), "{md}");
        let kafka = markdown(&[row(
            "chaos-k.json",
            &report(3, 60.0, false, true),
            &Value::Null,
        )]);
        assert!(!kafka.contains("On RabbitMQ"));
    }

    /// A committed campaign's table, made again from its reports.
    #[test]
    fn a_committed_summary_is_rebuilt_byte_for_byte() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../results/chaos/failover-apache-kafka-4.4.0");
        let committed = std::fs::read_to_string(dir.join("summary.md")).unwrap();
        assert_eq!(of_dir(&dir).unwrap(), committed);
    }
}

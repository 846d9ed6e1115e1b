//! `replay-compare`, for `scripts/replay-compare.sh`: `append` adds each replay run (the JSON line
//! `replay --report` writes, from whichever build ran it) to the comparison's file with its round;
//! `summary` prints, per configuration, the median [min–max] of records/s, PostgreSQL CPU
//! µs/record, the replay's own CPU µs/record, WAL bytes/record and statements per transaction,
//! and of its ratio to the baseline (the first label unless given) over the rounds both ran in.
//! A configuration with a run whose database did not match the model is flagged.
//!
//! Invariant: a run's line keeps its keys in their order, `round` added last, so that the lines
//! of older builds and newer ones read alike; a ratio only pairs runs of the same round.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// `replay-compare` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayCompareArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: ReplayCompareCommand,
}

/// `replay-compare` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ReplayCompareCommand {
    /// Append the runs of a `replay --report` file to --out, each with `"round": ROUND`.
    Append {
        /// The round of the runs.
        #[arg(long)]
        round: u64,
        /// The replay's report (JSON lines).
        #[arg(long)]
        run: PathBuf,
        /// The comparison's JSON-lines file.
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the comparison's table (Markdown).
    Summary {
        /// The comparison's JSON-lines file.
        runs: PathBuf,
        /// The configuration the ratios are to (the first one's label by default).
        baseline: Option<String>,
    },
}

/// Runs a `replay-compare` subcommand.
pub fn run(args: &ReplayCompareArgs) -> Result<()> {
    match &args.command {
        ReplayCompareCommand::Append { round, run, out } => {
            let text = std::fs::read_to_string(run)
                .with_context(|| format!("reading {}", run.display()))?;
            let mut lines = String::new();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                lines.push_str(
                    &with_round(line, *round).with_context(|| run.display().to_string())?,
                );
                lines.push('\n');
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(out)
                .and_then(|mut f| f.write_all(lines.as_bytes()))
                .with_context(|| format!("appending to {}", out.display()))
        }
        ReplayCompareCommand::Summary { runs, baseline } => {
            let text = std::fs::read_to_string(runs)
                .with_context(|| format!("reading {}", runs.display()))?;
            print!("{}", summary(&text, baseline.as_deref())?);
            Ok(())
        }
    }
}

/// The JSON object `line` with `"round": round` as its last key.
pub fn with_round(line: &str, round: u64) -> Result<String> {
    let value: Value = serde_json::from_str(line).context("a run that is not JSON")?;
    let Some(object) = value.as_object() else {
        bail!("a run that is not a JSON object");
    };
    if object.contains_key("round") {
        bail!("the run has a round already");
    }
    let body = line.trim_end();
    let body = body
        .strip_suffix('}')
        .context("a run that is not one line")?;
    let sep = if object.is_empty() { "" } else { "," };
    Ok(format!("{body}{sep}\"round\":{round}}}"))
}

/// The figures of the table: key, column, decimals.
const FIELDS: [(&str, &str, usize); 5] = [
    ("records_per_s", "records/s", 0),
    ("pg_cpu_us_per_record", "PG CPU µs/rec", 2),
    ("replay_cpu_us_per_record", "replay CPU µs/rec", 2),
    ("wal_bytes_per_record", "WAL B/rec", 0),
    ("statements_per_transaction", "statements/tx", 2),
];

/// The figures that also get a ratio to the baseline.
const RATIOS: [&str; 3] = [
    "records_per_s",
    "pg_cpu_us_per_record",
    "wal_bytes_per_record",
];

/// `median [min–max]` of `values` (not empty) with `digits` decimals.
pub fn spread(values: &[f64], digits: usize) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    format!(
        "{median:.digits$} [{:.digits$}–{:.digits$}]",
        v[0],
        v[n - 1]
    )
}

/// The table of the runs in `jsonl`, with ratios to `baseline` (the first run's label when
/// `None`).
pub fn summary(jsonl: &str, baseline: Option<&str>) -> Result<String> {
    let runs: Vec<Value> = jsonl
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("line {}", i + 1)))
        .collect::<Result<_>>()?;
    let label = |r: &Value| r["label"].as_str().map(str::to_owned);
    let round = |r: &Value| r["round"].as_u64();
    // Labels in the order they first appear.
    let mut groups: Vec<(String, Vec<&Value>)> = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let l = label(r).with_context(|| format!("run {} has no label", i + 1))?;
        round(r).with_context(|| format!("run {} ({l}) has no round", i + 1))?;
        match groups.iter_mut().find(|(g, _)| *g == l) {
            Some((_, g)) => g.push(r),
            None => groups.push((l, vec![r])),
        }
    }
    let base_label = match baseline {
        Some(b) => b.to_owned(),
        None => groups.first().map(|(l, _)| l.clone()).context("no run")?,
    };
    let base: Vec<&Value> = groups
        .iter()
        .find(|(l, _)| *l == base_label)
        .map(|(_, g)| g.clone())
        .with_context(|| format!("no run of the baseline {base_label}"))?;
    // The baseline's run of a round (its last one there).
    let base_of = |r: u64| base.iter().rev().find(|b| round(b) == Some(r));
    let figure = |r: &Value, key: &str| r.get(key).and_then(Value::as_f64);

    let mut header: Vec<String> = ["configuration", "runs"].map(str::to_owned).to_vec();
    header.extend(FIELDS.iter().map(|(_, name, _)| (*name).to_owned()));
    header.extend(
        FIELDS
            .iter()
            .filter(|(key, _, _)| RATIOS.contains(key))
            .map(|(_, name, _)| format!("{name} ÷ {base_label}")),
    );
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
    for (label, group) in &groups {
        let mut cells = vec![label.clone(), group.len().to_string()];
        for (key, _, digits) in FIELDS {
            let values: Vec<f64> = group.iter().filter_map(|r| figure(r, key)).collect();
            cells.push(if values.is_empty() {
                "–".to_owned()
            } else {
                spread(&values, digits)
            });
        }
        for key in RATIOS {
            let ratios: Vec<f64> = group
                .iter()
                .filter_map(|r| {
                    let b = base_of(round(r)?)?;
                    let (x, y) = (figure(r, key)?, figure(b, key)?);
                    (x != 0.0 && y != 0.0).then_some(x / y)
                })
                .collect();
            cells.push(if ratios.is_empty() {
                "–".to_owned()
            } else {
                spread(&ratios, 3)
            });
        }
        let bad = group
            .iter()
            .filter(|r| r["differences"].as_array().is_some_and(|d| !d.is_empty()))
            .count();
        if bad > 0 {
            cells[0].push_str(&format!(" (MISMATCH in {bad} runs)"));
        }
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_round_is_added_last_and_the_rest_kept_as_it_was() {
        assert_eq!(
            with_round(r#"{"label":"a","records":3}"#, 2).unwrap(),
            r#"{"label":"a","records":3,"round":2}"#
        );
        assert_eq!(with_round("{}", 0).unwrap(), r#"{"round":0}"#);
        assert_eq!(
            with_round("{\"z\": 1, \"a\": 2}  ", 1).unwrap(),
            r#"{"z": 1, "a": 2,"round":1}"#
        );
        assert!(with_round(r#"{"round":1}"#, 2).is_err());
        assert!(with_round("[1]", 2).is_err());
        assert!(with_round("{", 2).is_err());
    }

    #[test]
    fn spread_is_median_and_range() {
        assert_eq!(spread(&[3.0, 1.0, 2.0], 1), "2.0 [1.0–3.0]");
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0], 2), "2.50 [1.00–4.00]");
        assert_eq!(spread(&[1.23456], 3), "1.235 [1.235–1.235]");
    }

    fn run(label: &str, round: u64, rate: f64, wal: Option<f64>, differences: &str) -> String {
        let wal = wal.map_or("null".to_owned(), |w| w.to_string());
        format!(
            r#"{{"label":"{label}","records_per_s":{rate},"pg_cpu_us_per_record":2.0,"replay_cpu_us_per_record":1.0,"wal_bytes_per_record":{wal},"statements_per_transaction":4.5,"differences":{differences},"round":{round}}}"#
        )
    }

    #[test]
    fn ratios_pair_runs_of_a_round_and_mismatches_are_flagged() {
        let jsonl = [
            run("base", 0, 100.0, Some(300.0), "[]"),
            run("new", 0, 150.0, Some(330.0), "[]"),
            run("new", 1, 200.0, None, r#"["balance of 1"]"#),
            run("base", 1, 100.0, Some(300.0), "[]"),
            run("new", 2, 120.0, Some(300.0), "[]"),
        ]
        .join("\n");
        let table = summary(&jsonl, None).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(
            lines[0].ends_with("| records/s ÷ base | PG CPU µs/rec ÷ base | WAL B/rec ÷ base |")
        );
        assert_eq!(lines[1], "|---|---|---|---|---|---|---|---|---|---|");
        assert_eq!(
            lines[2],
            "| base | 2 | 100 [100–100] | 2.00 [2.00–2.00] | 1.00 [1.00–1.00] | 300 [300–300] \
             | 4.50 [4.50–4.50] | 1.000 [1.000–1.000] | 1.000 [1.000–1.000] | 1.000 [1.000–1.000] |"
        );
        // Round 2 has no baseline run: no ratio; round 1's WAL is unknown.
        assert_eq!(
            lines[3],
            "| new (MISMATCH in 1 runs) | 3 | 150 [120–200] | 2.00 [2.00–2.00] | 1.00 [1.00–1.00] \
             | 315 [300–330] | 4.50 [4.50–4.50] | 1.750 [1.500–2.000] | 1.000 [1.000–1.000] \
             | 1.100 [1.100–1.100] |"
        );
        let other = summary(&jsonl, Some("new")).unwrap();
        assert!(other.contains("| records/s ÷ new |"));
    }

    #[test]
    fn a_run_without_its_round_or_an_unknown_baseline_is_an_error() {
        let err = summary(r#"{"label":"a"}"#, None).unwrap_err().to_string();
        assert!(err.contains("no round"), "{err}");
        let one = run("a", 0, 1.0, None, "[]");
        let err = summary(&one, Some("b")).unwrap_err().to_string();
        assert!(err.contains("baseline b"), "{err}");
    }
}

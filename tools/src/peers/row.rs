//! `peers row`: the result rows of `scripts/peers/compare.sh`, one JSON line per run (a sink on
//! one work), its rate and CPU per 1000 records from the run's `cpu` figures, and the state it
//! left.
//!
//! Invariant: a row's rate and CPU divide by the input's records (the topic's, duplicates
//! included), the same denominator for every sink; a run without figures (a kill run, not
//! timed) gets wall_s 1 and zero CPU, which the table shows as not measured.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

use crate::cpu::sample::Figures;

/// `peers row` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RowArgs {
    /// The JSON-lines file to append the row to.
    #[arg(long)]
    pub rows: PathBuf,
    /// The work: upsert or additive.
    #[arg(long)]
    pub work: String,
    /// The run's label.
    #[arg(long)]
    pub label: String,
    /// The sink, as the table names it.
    #[arg(long)]
    pub sink: String,
    /// The input's records.
    #[arg(long)]
    pub records: u64,
    /// The run's figures (`cpu stop`/`cpu run` JSON): wall_s, process_cpu_s (the sink),
    /// postgres_cpu_s, broker_cpu_s, machine_cpu_s. Absent: not measured.
    #[arg(long)]
    pub cpu: Option<PathBuf>,
    /// The state the run left (a JSON object).
    #[arg(long)]
    pub state: String,
    /// A note for the table.
    #[arg(long, default_value = "")]
    pub note: String,
}

/// Appends the row of `args` to its file and prints it.
pub fn append(args: &RowArgs) -> Result<()> {
    let figures = match &args.cpu {
        Some(path) => {
            let text =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Some(serde_json::from_slice(&text).with_context(|| format!("{}", path.display()))?)
        }
        None => None,
    };
    let state: Value = serde_json::from_str(&args.state).context("--state is not JSON")?;
    let row = row(args, figures.as_ref(), state);
    let line = serde_json::to_string(&row)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.rows)
        .with_context(|| format!("opening {}", args.rows.display()))?;
    writeln!(file, "{line}")?;
    println!("{line}");
    Ok(())
}

/// One row, its fields in the table's order.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    work: String,
    label: String,
    sink: String,
    records: u64,
    wall_s: f64,
    msgs_per_s: u64,
    cpu_ms_per_1k: PerThousand,
    state: Value,
    note: String,
}

/// CPU ms per 1000 records (= µs per record).
#[derive(Debug, Clone, Serialize)]
struct PerThousand {
    sink: f64,
    postgres: f64,
    broker: f64,
    machine: f64,
}

/// The row: figures in CPU ms per 1000 records, rounded as the table shows them (wall_s to
/// 0.01 s, CPU to 0.1 ms).
pub fn row(args: &RowArgs, figures: Option<&Figures>, state: Value) -> Row {
    let n = args.records.max(1) as f64;
    let wall = figures.map_or(1.0, |f| f.wall_s);
    let per_1k = |s: Option<f64>| round(s.unwrap_or(0.0) * 1e6 / n, 1);
    let f = figures.cloned().unwrap_or_default();
    Row {
        work: args.work.clone(),
        label: args.label.clone(),
        sink: args.sink.clone(),
        records: args.records,
        wall_s: round(wall, 2),
        msgs_per_s: (args.records as f64 / wall.max(1e-9)).round() as u64,
        cpu_ms_per_1k: PerThousand {
            sink: per_1k(f.process_cpu_s),
            postgres: per_1k(f.postgres_cpu_s),
            broker: per_1k(f.broker_cpu_s),
            machine: per_1k(f.machine_cpu_s),
        },
        state,
        note: args.note.clone(),
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args() -> RowArgs {
        RowArgs {
            rows: PathBuf::from("unused"),
            work: "upsert".into(),
            label: "batch-inbox".into(),
            sink: "batch-inbox run --handler sql".into(),
            records: 20000,
            cpu: None,
            state: "{}".into(),
            note: String::new(),
        }
    }

    #[test]
    fn figures_become_a_rate_and_cpu_per_1000_records() {
        let f = Figures {
            wall_s: 4.0,
            machine_cpu_s: Some(6.0),
            broker_cpu_s: Some(1.0),
            postgres_cpu_s: Some(2.5),
            process_cpu_s: Some(0.5),
        };
        let r = serde_json::to_value(row(&args(), Some(&f), json!({"rows": 3}))).unwrap();
        assert_eq!(r["msgs_per_s"], 5000);
        assert_eq!(r["wall_s"], 4.0);
        assert_eq!(
            r["cpu_ms_per_1k"],
            json!({"sink": 25.0, "postgres": 125.0, "broker": 50.0, "machine": 300.0})
        );
        assert_eq!(r["state"]["rows"], 3);
    }

    #[test]
    fn the_row_keeps_the_table_s_field_order() {
        let line = serde_json::to_string(&row(&args(), None, json!({}))).unwrap();
        let at = |k: &str| line.find(&format!("\"{k}\":")).unwrap();
        let order = ["work", "label", "sink", "records", "wall_s", "msgs_per_s"];
        assert!(order.windows(2).all(|w| at(w[0]) < at(w[1])));
        assert!(line
            .contains(r#""cpu_ms_per_1k":{"sink":0.0,"postgres":0.0,"broker":0.0,"machine":0.0}"#));
    }

    #[test]
    fn a_run_without_figures_is_not_measured() {
        let r = serde_json::to_value(row(&args(), None, json!({}))).unwrap();
        assert_eq!(r["wall_s"], 1.0);
        assert_eq!(r["msgs_per_s"], 20000);
        assert_eq!(r["cpu_ms_per_1k"]["machine"], 0.0);
    }
}

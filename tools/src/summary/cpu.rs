//! The "where the CPU went" section: for each run the load test sampled, the machine's CPU time
//! split between the processor, the broker, and PostgreSQL with everything else.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{header, read_json, row, SummaryError};
use crate::report::RunReport;

/// One run's CPU sample, as `scripts/loadtest.sh` writes it to `cpu/<label>.json`.
#[derive(Debug, Deserialize)]
struct CpuSample {
    wall_s: f64,
    machine_cpu_s: f64,
    broker_cpu_s: f64,
}

const HEAD: &str = concat!(
    "configuration|wall s|CPU busy|processor s|broker s|PostgreSQL and rest s|",
    "CPU µs per record|processor µs per record"
);

/// The section, or an empty string when the load test recorded no CPU samples.
pub(super) fn section(
    input: &Path,
    machine: &Map<String, Value>,
    runs: &[RunReport],
) -> Result<String, SummaryError> {
    let samples = read_samples(&input.join("cpu"))?;
    if samples.is_empty() {
        return Ok(String::new());
    }
    let cores = machine.get("cores").and_then(Value::as_f64).unwrap_or(1.0);
    let mut md = String::from("\n## Where the CPU went\n\n");
    md.push_str(&format!(
        "Machine CPU time during each drain ({cores} cores): the processor's own (from the \
         process), the broker's (from its process), and the rest, which is PostgreSQL and \
         anything else running.\n"
    ));
    header(&mut md, HEAD);
    for r in runs {
        if let Some(s) = samples.get(&r.label) {
            row(&mut md, &cells(r, s, cores));
        }
    }
    Ok(md)
}

fn cells(r: &RunReport, s: &CpuSample, cores: f64) -> Vec<String> {
    let records = r.stats.records.max(1) as f64;
    let rest = (s.machine_cpu_s - s.broker_cpu_s - r.cpu_s).max(0.0);
    let busy = s.machine_cpu_s / (s.wall_s * cores).max(1e-9);
    vec![
        r.label.clone(),
        format!("{:.1}", s.wall_s),
        format!("{:.0}%", busy * 100.0),
        format!("{:.1}", r.cpu_s),
        format!("{:.1}", s.broker_cpu_s),
        format!("{rest:.1}"),
        format!("{:.1}", s.machine_cpu_s / records * 1e6),
        format!("{:.1}", r.cpu_s / records * 1e6),
    ]
}

fn read_samples(dir: &Path) -> Result<BTreeMap<String, CpuSample>, SummaryError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(BTreeMap::new());
    };
    let mut samples = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") {
            if let Some(label) = path.file_stem().and_then(|s| s.to_str()) {
                samples.insert(label.to_owned(), read_json(&path)?);
            }
        }
    }
    Ok(samples)
}

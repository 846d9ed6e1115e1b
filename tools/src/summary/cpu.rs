//! The "where the CPU went" section: for each run the load test sampled, the machine's CPU time
//! split between the processor, the broker, PostgreSQL's processes and the rest.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::{header, read_json, row, SummaryError, DASH};
use crate::report::RunReport;

/// One run's CPU sample, as `scripts/loadtest.sh` writes it to `cpu/<label>.json` (`cpu stop`).
#[derive(Debug, Deserialize)]
pub(super) struct CpuSample {
    wall_s: f64,
    machine_cpu_s: f64,
    /// The broker's process (absent when the broker is not one of the run's: KAFKA_BROKERS).
    #[serde(default)]
    pub(super) broker_cpu_s: f64,
    /// PostgreSQL's processes (absent in samples of older load tests).
    #[serde(default)]
    pub(super) postgres_cpu_s: Option<f64>,
}

/// The CPU samples by run label.
pub(super) type Samples = BTreeMap<String, CpuSample>;

/// PostgreSQL's CPU per record of `r`, in µs, when sampled.
pub(super) fn postgres_us_per_record(samples: &Samples, r: &RunReport) -> Option<f64> {
    let s = r.postgres_cpu_s.or(samples.get(&r.label)?.postgres_cpu_s)?;
    Some(s / r.stats.records.max(1) as f64 * 1e6)
}

const HEAD: &str = concat!(
    "configuration|wall s|CPU busy|processor s|broker s|PostgreSQL s|rest s|",
    "CPU µs per record|processor µs per record|PostgreSQL µs per record"
);

/// The section, or an empty string when the load test recorded no CPU samples.
pub(super) fn section(samples: &Samples, cores: f64, runs: &[RunReport]) -> String {
    if samples.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Where the CPU went\n\n");
    md.push_str(&format!(
        "Machine CPU time during each run ({cores} cores): the processor's own (from the \
         process), the broker's (from its process), PostgreSQL's (the postmaster and its \
         backends, ended ones included) and the rest (the load tools and anything else).\n"
    ));
    header(&mut md, HEAD);
    for r in runs {
        if let Some(s) = samples.get(&r.label) {
            row(&mut md, &cells(r, s, cores));
        }
    }
    md
}

fn cells(r: &RunReport, s: &CpuSample, cores: f64) -> Vec<String> {
    let records = r.stats.records.max(1) as f64;
    // The processor's window alone when drain measured it, else the whole sample's.
    let pg_s = r.postgres_cpu_s.or(s.postgres_cpu_s);
    let pg = pg_s.unwrap_or(0.0);
    let rest = (s.machine_cpu_s - s.broker_cpu_s - r.cpu_s - pg).max(0.0);
    let busy = s.machine_cpu_s / (s.wall_s * cores).max(1e-9);
    let per_record = |v: f64| format!("{:.1}", v / records * 1e6);
    vec![
        r.label.clone(),
        format!("{:.1}", s.wall_s),
        format!("{:.0}%", busy * 100.0),
        format!("{:.1}", r.cpu_s),
        format!("{:.1}", s.broker_cpu_s),
        pg_s.map_or(DASH.into(), |v| format!("{v:.1}")),
        format!("{rest:.1}"),
        per_record(s.machine_cpu_s),
        per_record(r.cpu_s),
        pg_s.map_or(DASH.into(), per_record),
    ]
}

pub(super) fn read_samples(dir: &Path) -> Result<Samples, SummaryError> {
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

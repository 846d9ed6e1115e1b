//! Turns a load test's run reports into `summary.md` and SVG plots.
//!
//! Input: `<input>/machine.json` (any JSON object, printed as a table), `<input>/runs/*.json`
//! ([`RunReport`]s), `<input>/cpu/*.json` (CPU samples per run) and `<input>/replay.jsonl`
//! (database-only replay reports). Runs with a producer rate are fixed-rate latency runs; the
//! others are backlog drains. Labels group the drains: `remote-*` ran through a delaying proxy in
//! front of PostgreSQL, `scale-p<N>` with N processes, `floor-r<rate>` is the consume-only floor of
//! the fixed-rate runs at that rate. `summary.md` holds the tables and the targets, each MET,
//! MISSED or not measured. Runs whose verification failed are flagged as FAILED RUN and count
//! neither toward a target nor as a reference rate. Plots: `throughput.svg` (batched msgs/s
//! against batch size, log–log, with the per-message, consume-only and COPY rates as dashed
//! reference lines), `latency-distribution.svg` (each fixed-rate run's percentile distribution)
//! and `latency-vs-rate.svg` (p99 against the input rate, per batch size).

use std::fs;
use std::path::{Path, PathBuf};

use plotters::prelude::DrawingAreaErrorKind;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::report::RunReport;

/// Failure to read the reports or write the summary.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A report did not parse.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: serde_json::Error,
    },
    /// A plot could not be drawn.
    #[error("plot {path}: {message}")]
    Plot {
        /// The file.
        path: PathBuf,
        /// The failure.
        message: String,
    },
}

const DASH: &str = "—";
const THROUGHPUT_HEAD: &str = concat!(
    "configuration|mode|batch size|msgs/s|× per-message|% of COPY ceiling|% of consume-only|",
    "p50 ms|p99 ms|",
    "p99.9 ms|statements/msg|transactions|peak RSS MiB|verified"
);
const LATENCY_HEAD: &str = concat!(
    "configuration|batching|batch size|linger ms|rate msgs/s|p50|p90|p99|p99.9|max|",
    "acked p99|receive p99|in batch p99|dedup p99|handler p99|commit p99|",
    "floor receive p99|floor e2e p99|added p99"
);
const SQL_HEAD: &str =
    "configuration|mode|batch size|msgs/s|Rust ledger run|ledger msgs/s|SQL / ledger|verified";
/// Stages whose p99 the latency table shows, as in [`LATENCY_HEAD`].
const STAGES: [&str; 3] = ["dedup", "handler", "commit"];

/// Reads the load test's output in `input`, writes `<output>/summary.md` and the plots. Returns
/// the files written.
pub fn write(input: &Path, output: &Path) -> Result<Vec<PathBuf>, SummaryError> {
    let machine: Map<String, Value> = read_json(&input.join("machine.json"))?;
    let runs = read_runs(&input.join("runs"))?;
    let samples = cpu::read_samples(&input.join("cpu"))?;
    let replays = sections::read_replays(&input.join("replay.jsonl"))?;
    fs::create_dir_all(output).map_err(io_err(output))?;
    let files = [
        "summary.md",
        "throughput.svg",
        "latency-distribution.svg",
        "latency-vs-rate.svg",
    ];
    let [md, tp, dist, lat] = files.map(|f| output.join(f));
    let mut text = render(&machine, &runs);
    text.push_str(&rates::section(&runs, &samples));
    text.push_str(&sections::replay(&runs, &replays));
    text.push_str(&sections::scale_out(&runs, &samples));
    text.push_str(&sections::remote(&runs));
    let cores = machine.get("cores").and_then(Value::as_f64).unwrap_or(1.0);
    text.push_str(&cpu::section(&samples, cores, &runs));
    let facts = targets::Facts {
        runs: &runs,
        samples: &samples,
        replays: &replays,
        messages: machine.get("messages").and_then(Value::as_u64),
        default_batching: machine.get("default_batching").and_then(Value::as_str),
    };
    text.push_str(&targets::section(&facts));
    fs::write(&md, text).map_err(io_err(&md))?;
    plots::plot_throughput(&runs, &tp).map_err(plot_err(&tp))?;
    plots::plot_distribution(&runs, &dist).map_err(plot_err(&dist))?;
    plots::plot_latency_vs_rate(&runs, &lat).map_err(plot_err(&lat))?;
    Ok(vec![md, tp, dist, lat])
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SummaryError {
    let path = path.to_owned();
    move |source| SummaryError::Io { path, source }
}

fn plot_err(path: &Path) -> impl FnOnce(DrawingAreaErrorKind<std::io::Error>) -> SummaryError {
    let path = path.to_owned();
    move |e| SummaryError::Plot {
        path,
        message: e.to_string(),
    }
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, SummaryError> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    serde_json::from_slice(&bytes).map_err(|source| SummaryError::Json {
        path: path.into(),
        source,
    })
}

mod cpu;
mod plots;
mod rates;
mod rows;
use rows::{latency_row, sql_handler, throughput_row};
mod sections;
mod targets;

/// Every `*.json` report in `dir`, in table order.
fn read_runs(dir: &Path) -> Result<Vec<RunReport>, SummaryError> {
    let entries = fs::read_dir(dir).map_err(io_err(dir))?;
    let paths: Result<Vec<_>, _> = entries.map(|e| e.map(|e| e.path())).collect();
    let mut paths = paths.map_err(io_err(dir))?;
    paths.retain(|p| p.extension().is_some_and(|e| e == "json"));
    paths.sort();
    let runs: Result<Vec<RunReport>, _> = paths.iter().map(|p| read_json(p)).collect();
    let mut runs = runs?;
    runs.sort_by(|a, b| order(a).cmp(&order(b)));
    Ok(runs)
}

/// The Rust ledger's runs first, then the SQL handler's; each: per-message, batched by batch
/// size, consume-only, copy, then any other mode.
fn order(r: &RunReport) -> (bool, usize, u64, u64, &str) {
    let modes = ["per-message", "batched", "consume-only", "copy"];
    let rank = modes.iter().position(|m| *m == r.settings.mode);
    let rank = rank.unwrap_or(modes.len());
    (
        is_sql(r),
        rank,
        r.settings.batch_size,
        r.settings.linger_ms,
        &r.label,
    )
}

/// A run of the SQL handler (`run --handler sql`): compared with the ledger, never a reference.
fn is_sql(r: &RunReport) -> bool {
    r.settings.handler == "sql"
}

fn is_drain(r: &RunReport) -> bool {
    r.input_rate.is_none()
}

/// A backlog drain of the main input on the local database with one process: the runs the
/// reference rates and the main table come from.
fn is_main_drain(r: &RunReport) -> bool {
    is_drain(r) && !r.label.starts_with("remote-") && !r.label.starts_with("scale-p")
}

/// A consume-only fixed-rate run: the floor of the latency runs at its rate.
fn is_floor(r: &RunReport) -> bool {
    !is_drain(r) && r.settings.mode == "consume-only"
}

/// Not known to have left a wrong database.
fn trusted(r: &RunReport) -> bool {
    r.verified != Some(false)
}

/// Records per batch: 1 for the per-message baseline, none for the ceilings.
fn batch_of(r: &RunReport) -> Option<u64> {
    match r.settings.mode.as_str() {
        "per-message" => Some(1),
        "batched" => Some(r.settings.batch_size.max(1)),
        _ => None,
    }
}

/// The fastest trusted main drain that `keep` accepts.
fn best(runs: &[RunReport], keep: impl Fn(&RunReport) -> bool) -> Option<&RunReport> {
    let drains = runs
        .iter()
        .filter(|r| is_main_drain(r) && trusted(r) && keep(r));
    drains.max_by(|a, b| a.msgs_per_sec.total_cmp(&b.msgs_per_sec))
}

/// The reference rate of a mode: its fastest trusted backlog drain (not of the SQL handler).
fn best_rate(runs: &[RunReport], mode: &str) -> Option<f64> {
    let r = best(runs, |r| r.settings.mode == mode && !is_sql(r))?;
    Some(r.msgs_per_sec).filter(|v| *v > 0.0)
}

/// A non-negative number, rounded, with thousands separators.
fn int(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ms(v: f64) -> String {
    format!("{v:.*}", if v.abs() >= 100.0 { 1 } else { 2 })
}

fn or_dash(show: bool, s: String) -> String {
    if show {
        s
    } else {
        DASH.into()
    }
}

/// Records per batch for a table, "—" for the ceilings.
fn batch_cell(r: &RunReport) -> String {
    batch_of(r).map_or(DASH.into(), |b| b.to_string())
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

fn row(md: &mut String, cells: &[String]) {
    md.push_str(&format!("| {} |\n", cells.join(" | ")));
}

/// A table header from `|`-separated column names.
fn header(md: &mut String, names: &str) {
    let rule = "---|".repeat(names.split('|').count());
    md.push_str(&format!("\n| {} |\n|{rule}\n", names.replace('|', " | ")));
}

fn render(machine: &Map<String, Value>, runs: &[RunReport]) -> String {
    let mut md = String::from("# batch-inbox load test summary\n\n## Machine and settings\n");
    header(&mut md, "key|value");
    for (k, v) in machine {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        row(&mut md, &[cell(k), cell(&v)]);
    }
    let (base, copy) = (best_rate(runs, "per-message"), best_rate(runs, "copy"));
    let consume = best_rate(runs, "consume-only");
    md.push_str("\n## Throughput (backlog drain)\n\n");
    md.push_str("Latency in a backlog drain is mostly the time a record waited in the topic; ");
    md.push_str("see the fixed-rate runs for latency.\n");
    header(&mut md, THROUGHPUT_HEAD);
    for r in runs.iter().filter(|r| is_main_drain(r)) {
        row(&mut md, &throughput_row(r, base, copy, consume));
    }
    sql_handler(&mut md, runs);
    md.push_str("\n## Latency (fixed rate)\n\n");
    md.push_str("Per record, in ms: end to end is the Kafka timestamp (CreateTime, set by the ");
    md.push_str("producer) to COMMIT; acked is that timestamp to the broker's acknowledgement to ");
    md.push_str("the producer (producer linger, produce request, broker append); receive is that ");
    md.push_str("timestamp to the record's arrival at its partition worker (producer, broker, ");
    md.push_str("consumer fetch); in batch is arrival to the ");
    md.push_str("batch's close. Stages: p99 per transaction. Floor: the consume-only run at the ");
    md.push_str("same rate (`floor-r<rate>`), the broker and client alone; added p99 is the ");
    md.push_str("run's end-to-end p99 less the floor's receive p99.\n");
    header(&mut md, LATENCY_HEAD);
    for r in runs.iter().filter(|r| !is_drain(r)) {
        row(&mut md, &latency_row(r, floor_of(runs, r)));
    }
    md
}

/// The consume-only run at `r`'s rate, if any.
fn floor_of<'a>(runs: &'a [RunReport], r: &RunReport) -> Option<&'a RunReport> {
    let rate = r.input_rate?;
    let same = |f: &&RunReport| is_floor(f) && f.input_rate.is_some_and(|x| (x - rate).abs() < 0.5);
    runs.iter().find(same)
}

/// Linger or natural, from the label (the stats file does not say).
fn batching(r: &RunReport) -> &'static str {
    if r.label.contains("natural") {
        "natural"
    } else {
        "linger"
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "**MET**"
    } else {
        "**MISSED**"
    }
}

/// "margin" when `actual` is on the right side of `target`, "gap" otherwise.
fn gap(actual: f64, target: f64, more_is_better: bool, text: impl Fn(f64) -> String) -> String {
    let d = actual - target;
    let met = if more_is_better { d >= 0.0 } else { d <= 0.0 };
    format!("{} {}", if met { "margin" } else { "gap" }, text(d.abs()))
}

#[cfg(test)]
mod tests;

//! Turns a load test's run reports into `summary.md` and SVG plots.
//!
//! Input: `<input>/machine.json` (any JSON object, printed as a table) and `<input>/runs/*.json`
//! ([`RunReport`]s). Runs with a producer rate are fixed-rate latency runs; the others are backlog
//! drains. `summary.md` holds a throughput table of the drains, a latency table of the fixed-rate
//! runs and the targets, each MET, MISSED or not measured. Runs whose verification failed are
//! flagged as FAILED RUN and count neither toward a target nor as a reference rate.
//! `throughput.svg` plots batched msgs/s against batch size (log–log; the `backlog-1m` memory run
//! is left out) with the per-message, consume-only and COPY rates as dashed reference lines;
//! `latency.svg` plots the fixed-rate runs' p50/p99/p99.9 end-to-end latency against batch size
//! (log–log, also for a single batch size).

use std::fs;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::report::RunReport;
use batch_inbox::internal::metrics::Percentiles;

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
    "configuration|batch size|linger ms|rate msgs/s|p50|p90|p99|p99.9|max|",
    "batch_wait p99|dedup p99|handler p99|commit p99|offset_store p99"
);
const SQL_HEAD: &str =
    "configuration|mode|batch size|msgs/s|Rust ledger run|ledger msgs/s|SQL / ledger|verified";
/// Stages whose p99 the latency table shows, as in [`LATENCY_HEAD`].
const STAGES: [&str; 5] = ["batch_wait", "dedup", "handler", "commit", "offset_store"];

/// Reads `<input>/machine.json` and `<input>/runs/*.json`, writes `<output>/summary.md`,
/// `<output>/throughput.svg` and `<output>/latency.svg`. Returns the files written.
pub fn write(input: &Path, output: &Path) -> Result<Vec<PathBuf>, SummaryError> {
    let machine: Map<String, Value> = read_json(&input.join("machine.json"))?;
    let runs = read_runs(&input.join("runs"))?;
    fs::create_dir_all(output).map_err(io_err(output))?;
    let [md, tp, lat] = ["summary.md", "throughput.svg", "latency.svg"].map(|f| output.join(f));
    let mut text = render(&machine, &runs);
    text.push_str(&cpu::section(input, &machine, &runs)?);
    fs::write(&md, text).map_err(io_err(&md))?;
    plot_throughput(&runs, &tp).map_err(plot_err(&tp))?;
    plot_latency(&runs, &lat).map_err(plot_err(&lat))?;
    Ok(vec![md, tp, lat])
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

/// The fastest trusted backlog drain that `keep` accepts.
fn best(runs: &[RunReport], keep: impl Fn(&RunReport) -> bool) -> Option<&RunReport> {
    let drains = runs.iter().filter(|r| is_drain(r) && trusted(r) && keep(r));
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
    for r in runs.iter().filter(|r| is_drain(r)) {
        row(&mut md, &throughput_row(r, base, copy, consume));
    }
    sql_handler(&mut md, runs);
    md.push_str("\n## Latency (fixed rate)\n\nEnd-to-end: Kafka timestamp to COMMIT, per record. ");
    md.push_str("Stages: p99 per transaction. All in ms.\n");
    header(&mut md, LATENCY_HEAD);
    for r in runs.iter().filter(|r| !is_drain(r)) {
        row(&mut md, &latency_row(r));
    }
    targets(&mut md, runs, base, copy);
    md
}

fn throughput_row(
    r: &RunReport,
    base: Option<f64>,
    copy: Option<f64>,
    consume: Option<f64>,
) -> Vec<String> {
    let (db, e) = (r.settings.mode != "copy", &r.e2e_latency_ms);
    let lat = |v: f64| or_dash(db && e.count > 0, ms(v));
    let ratio =
        |b: Option<f64>, f: fn(f64) -> String| b.map_or(DASH.into(), |b| f(r.msgs_per_sec / b));
    let stmts = r
        .statements_per_msg
        .map_or("n/a".into(), |s| format!("{s:.3}"));
    let verified = r.verified.map_or(DASH, |v| if v { "yes" } else { "no" });
    vec![
        cell(&r.label),
        cell(&r.settings.mode),
        batch_cell(r),
        int(r.msgs_per_sec),
        ratio(base, |x| format!("{x:.1}×")),
        ratio(copy, |x| format!("{:.1}%", x * 100.0)),
        ratio(consume, |x| format!("{:.1}%", x * 100.0)),
        lat(e.p50),
        lat(e.p99),
        lat(e.p999),
        or_dash(db, stmts),
        or_dash(db, int(r.stats.transactions as f64)),
        or_dash(db, format!("{:.1}", r.peak_rss_mb)),
        verified.into(),
    ]
}

/// The SQL handler's drains next to the Rust ledger's drain of the same mode (and batch size).
fn sql_handler(md: &mut String, runs: &[RunReport]) {
    let sql: Vec<&RunReport> = runs.iter().filter(|r| is_drain(r) && is_sql(r)).collect();
    if sql.is_empty() {
        return;
    }
    md.push_str("\n## SQL handler vs the Rust ledger\n\n");
    md.push_str("The same input drained by `run --handler sql --apply-sql ");
    md.push_str("examples/sql/balances_upsert.sql` (one aggregate upsert per batch, no overdraft ");
    md.push_str("rule) and by the Rust ledger, in the same mode and batch size.\n");
    header(md, SQL_HEAD);
    for r in sql {
        let per_message = r.settings.mode == "per-message";
        let peer = best(runs, |l| {
            !is_sql(l)
                && l.settings.mode == r.settings.mode
                && (per_message || l.settings.batch_size == r.settings.batch_size)
        });
        let verified = r.verified.map_or(DASH, |v| if v { "yes" } else { "no" });
        row(
            md,
            &[
                cell(&r.label),
                cell(&r.settings.mode),
                batch_cell(r),
                int(r.msgs_per_sec),
                peer.map_or(DASH.into(), |l| cell(&l.label)),
                peer.map_or(DASH.into(), |l| int(l.msgs_per_sec)),
                peer.filter(|l| l.msgs_per_sec > 0.0)
                    .map_or(DASH.into(), |l| {
                        format!("{:.2}×", r.msgs_per_sec / l.msgs_per_sec)
                    }),
                verified.into(),
            ],
        );
    }
}

fn latency_row(r: &RunReport) -> Vec<String> {
    let e = &r.e2e_latency_ms;
    let mut cells = vec![
        cell(&r.label),
        batch_cell(r),
        r.settings.linger_ms.to_string(),
    ];
    cells.push(r.input_rate.map_or(DASH.into(), int));
    cells.extend([e.p50, e.p90, e.p99, e.p999, e.max].map(ms));
    let stage = |s: &&str| r.stages_ms.get(*s).map_or(DASH.into(), |p| ms(p.p99));
    cells.extend(STAGES.iter().map(stage));
    cells
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

fn targets(md: &mut String, runs: &[RunReport], base: Option<f64>, copy: Option<f64>) {
    md.push_str("\n## Targets\n\n");
    let big =
        |r: &RunReport| r.settings.mode == "batched" && r.settings.batch_size >= 500 && !is_sql(r);
    let best = best(runs, big);
    let a = "(a) best batched run (batch size ≥ 500) ≥ 30× per-message msgs/s";
    let b = "(b) that run ≥ 50% of the COPY ceiling";
    let lines = [
        ratio_target(a, best, base, 30.0, (1.0, "×", "×", "per-message")),
        ratio_target(b, best, copy, 50.0, (100.0, "%", " pp", "of COPY")),
        target_latency(runs),
        target_memory(runs),
    ];
    for line in lines {
        md.push_str(&format!("- {line}\n"));
    }
    for r in runs.iter().filter(|r| !trusted(r)) {
        let label = &r.label;
        md.push_str(&format!(
            "- **FAILED RUN** `{label}`: verification failed; not counted toward the targets.\n"
        ));
    }
}

/// `best`'s msgs/s relative to `base` (× `scale`) against `goal`.
fn ratio_target(
    name: &str,
    best: Option<&RunReport>,
    base: Option<f64>,
    goal: f64,
    (scale, unit, gap_unit, of): (f64, &str, &str, &str),
) -> String {
    let (Some(r), Some(base)) = (best, base) else {
        return format!("{name}: not measured");
    };
    let v = r.msgs_per_sec / base * scale;
    let g = gap(v, goal, true, |d| format!("{d:.1}{gap_unit}"));
    let (label, rate, base) = (&r.label, int(r.msgs_per_sec), int(base));
    let met = verdict(v >= goal);
    format!("{name}: {met} — `{label}` {rate} msgs/s = {v:.1}{unit} {of} ({base} msgs/s); {g}")
}

fn target_latency(runs: &[RunReport]) -> String {
    let name = "(c) every fixed-rate run's p99 ≤ linger + 50 ms";
    let fixed: Vec<&RunReport> = runs.iter().filter(|r| !is_drain(r) && trusted(r)).collect();
    if fixed.is_empty() {
        return format!("{name}: not measured");
    }
    let bound = |r: &RunReport| r.settings.linger_ms as f64 + 50.0;
    let met = |r: &RunReport| r.e2e_latency_ms.count > 0 && r.e2e_latency_ms.p99 <= bound(r);
    let mut out = format!("{name}: {}", verdict(fixed.iter().all(|r| met(r))));
    for r in fixed {
        let (label, p99, b) = (&r.label, r.e2e_latency_ms.p99, bound(r));
        let g = gap(p99, b, false, |d| format!("{} ms", ms(d)));
        let (v, p99, b) = (verdict(met(r)), ms(p99), ms(b));
        out.push_str(&format!(
            "\n  - `{label}`: {v} p99 {p99} ms, bound {b} ms; {g}"
        ));
    }
    out
}

fn target_memory(runs: &[RunReport]) -> String {
    let name = "(d) backlog-1m run's peak RSS ≤ 200 MiB";
    let keep = |r: &&RunReport| r.label.starts_with("backlog-1m") && trusted(r);
    let mem: Vec<&RunReport> = runs.iter().filter(keep).collect();
    if mem.is_empty() {
        return format!("{name}: not measured");
    }
    let part = |r: &&RunReport| {
        let g = gap(r.peak_rss_mb, 200.0, false, |d| format!("{d:.1} MiB"));
        format!("`{}` {:.1} MiB; {g}", r.label, r.peak_rss_mb)
    };
    let parts: Vec<String> = mem.iter().map(part).collect();
    let met = verdict(mem.iter().all(|r| r.peak_rss_mb <= 200.0));
    format!("{name}: {met} — {}", parts.join("; "))
}

type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// A legend entry and its points; a reference line has one point, drawn as a dashed horizontal.
struct Line(String, Vec<(f64, f64)>, RGBColor);

/// A positive range around the values for a log axis, `top` times the largest at the top.
/// Narrow ranges are widened to whole decades, where the axis has readable ticks.
fn span(values: impl Iterator<Item = f64>, top: f64) -> std::ops::Range<f64> {
    let v: Vec<f64> = values.filter(|v| *v > 0.0).collect();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min) / 2.0;
    let hi = v.iter().copied().fold(0.0, f64::max) * top;
    if v.is_empty() {
        return 1.0..10.0;
    }
    if hi / lo >= 100.0 {
        return lo..hi;
    }
    10f64.powf(lo.log10().floor())..10f64.powf(hi.log10().ceil())
}

/// An axis label: thousands separators from 10 up, at most two decimals below.
fn tick(v: &f64) -> String {
    if *v >= 10.0 {
        return int(*v);
    }
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn legend_mark(style: ShapeStyle) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style)
}

/// A log–log chart of `lines` (points joined by a line) and `refs` (dashed horizontals).
fn plot(path: &Path, caption: &str, axes: [&str; 2], lines: Vec<Line>, refs: Vec<Line>) -> Drawn {
    let x = span(lines.iter().flat_map(|l| l.1.iter().map(|p| p.0)), 2.0);
    let all = || lines.iter().chain(&refs);
    let y = span(all().flat_map(|l| l.1.iter().map(|p| p.1)), 5.0); // room for the legend
    let empty = all().all(|l| l.1.is_empty());
    let caption = format!("{caption}{}", if empty { " (no runs)" } else { "" });
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(x.clone().log_scale(), y.log_scale())?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(axes[0]).y_desc(axes[1]);
    mesh.x_label_formatter(&tick).y_label_formatter(&tick);
    mesh.draw()?;
    for Line(name, mut pts, color) in lines.into_iter().filter(|l| !l.1.is_empty()) {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let style = color.stroke_width(2);
        let series = chart.draw_series(LineSeries::new(pts.clone(), style))?;
        series.label(name).legend(legend_mark(style));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))?;
    }
    for Line(name, pts, color) in refs {
        let (style, y) = (color.stroke_width(2), pts[0].1);
        let dashed = DashedLineSeries::new([(x.start, y), (x.end, y)], 10, 6, style);
        let series = chart.draw_series(dashed)?;
        series.label(name).legend(legend_mark(style));
    }
    if !empty {
        let mut legend = chart.configure_series_labels();
        legend.position(SeriesLabelPosition::UpperLeft);
        legend.border_style(BLACK).background_style(WHITE.mix(0.85));
        legend.draw()?;
    }
    root.present()
}

fn plot_throughput(runs: &[RunReport], path: &Path) -> Drawn {
    let keep = |r: &&RunReport| is_drain(r) && r.settings.mode == "batched";
    let keep = |r: &&RunReport| keep(r) && !r.label.starts_with("backlog-1m") && !is_sql(r);
    let pts = runs.iter().filter(keep);
    let pts = pts.map(|r| (batch_of(r).unwrap_or(1) as f64, r.msgs_per_sec.max(1.0)));
    let lines = vec![Line("batched".into(), pts.collect(), BLUE)];
    let modes = [
        ("per-message", "per-message", RED),
        ("consume-only", "consume-only", GREEN),
    ];
    let refs = modes.into_iter().chain([("copy", "COPY ceiling", BLACK)]);
    let refs = refs.filter_map(|(mode, name, color)| {
        let v = best_rate(runs, mode)?;
        let name = format!("{name}: {} msgs/s", int(v));
        Some(Line(name, vec![(1.0, v)], color))
    });
    let axes = ["batch size (records, log)", "msgs/s (log)"];
    let caption = "Throughput vs batch size (backlog drain)";
    plot(path, caption, axes, lines, refs.collect())
}

fn plot_latency(runs: &[RunReport], path: &Path) -> Drawn {
    let fixed: Vec<&RunReport> = runs.iter().filter(|r| !is_drain(r)).collect();
    let line = |name: &str, f: fn(&Percentiles) -> f64, color| {
        let x = |r: &RunReport| batch_of(r).unwrap_or(1) as f64;
        let pts = fixed.iter().map(|r| (x(r), f(&r.e2e_latency_ms).max(0.01)));
        Line(name.into(), pts.collect(), color)
    };
    let lines = vec![
        line("p50", |p| p.p50, BLUE),
        line("p99", |p| p.p99, RED),
        line("p99.9", |p| p.p999, BLACK),
    ];
    let axes = ["batch size (records, log)", "end-to-end latency, ms (log)"];
    let caption = "End-to-end latency at a fixed rate";
    plot(path, caption, axes, lines, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_summary_and_both_plots() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let name = format!(
            "batch-inbox-summary-{}-{}",
            std::process::id(),
            t.unwrap().as_nanos()
        );
        let dir = std::env::temp_dir().join(name);
        let (input, output) = (dir.join("in"), dir.join("out"));
        fs::create_dir_all(input.join("runs")).unwrap();
        fs::write(
            input.join("machine.json"),
            r#"{"cores": 2, "broker": "redpanda"}"#,
        )
        .unwrap();
        let runs = [
            ("per-message", "per-message", 1, None, 1_000.0),
            ("batched-1000", "batched", 1000, None, 35_000.0),
            ("batched-2000", "batched", 2000, None, 90_000.0), // fails verification
            ("copy", "copy", 0, None, 100_000.0),
            ("rate-5k", "batched", 500, Some(5_000.0), 5_000.0),
            // Faster than the ledger here: never the target's run, nor a reference rate.
            ("sql-batched", "batched", 1000, None, 42_000.0),
            ("sql-per-message", "per-message", 1, None, 2_000.0),
        ];
        for (i, (label, mode, batch_size, rate, msgs_per_sec)) in runs.into_iter().enumerate() {
            let mut r = RunReport {
                label: label.into(),
                ..RunReport::default()
            };
            r.msgs_per_sec = msgs_per_sec;
            (r.settings.mode, r.settings.batch_size) = (mode.into(), batch_size);
            (r.input_rate, r.settings.linger_ms) = (rate, 20);
            r.verified = Some(label != "batched-2000");
            if label.starts_with("sql-") {
                r.settings.handler = "sql".into();
            }
            (r.stats.records, r.cpu_s) = (1_000_000, 3.0);
            let e2e = &mut r.e2e_latency_ms;
            (e2e.count, e2e.p50, e2e.p99, e2e.p999) = (100, 5.0, 60.0, 90.0);
            let json = serde_json::to_vec(&r).unwrap();
            fs::write(input.join(format!("runs/{i}.json")), json).unwrap();
        }
        fs::create_dir_all(input.join("cpu")).unwrap();
        let sample = r#"{"wall_s": 10.0, "machine_cpu_s": 18.0, "broker_cpu_s": 5.0}"#;
        fs::write(input.join("cpu/batched-1000.json"), sample).unwrap();
        let written = write(&input, &output).unwrap();
        let md = fs::read_to_string(&written[0]).unwrap();
        for want in [
            "| batched-1000 | 10.0 | 90% | 3.0 | 5.0 | 10.0 | 18.0 | 3.0 |",
            "| cores | 2 |",
            "| sql-batched | batched | 1000 | 42,000 | batched-1000 | 35,000 | 1.20× | yes |",
            "| sql-per-message | per-message | 1 | 2,000 | per-message | 1,000 | 2.00× | yes |",
            "| sql-batched | batched | 1000 | 42,000 | 42.0× |",
            "| broker | redpanda |",
            "| batched-1000 | batched | 1000 | 35,000 | 35.0× | 35.0% | — | 5.00 | 60.00 | 90.00 |",
            "≥ 30× per-message msgs/s: **MET** — `batched-1000` 35,000 msgs/s = 35.0×",
            "COPY ceiling: **MISSED** — `batched-1000`",
            "= 35.0% of COPY (100,000 msgs/s); gap 15.0 pp",
            "linger + 50 ms: **MET**\n  - `rate-5k`: **MET** p99 60.00 ms, bound 70.00 ms; margin 10.00 ms",
            "peak RSS ≤ 200 MiB: not measured",
            "**FAILED RUN** `batched-2000`",
        ] {
            assert!(md.contains(want), "missing {want:?} in\n{md}");
        }
        for svg in &written[1..] {
            assert!(
                fs::read_to_string(svg).unwrap().starts_with("<svg"),
                "{svg:?}"
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_input_names_the_file() {
        let dir = std::env::temp_dir().join(format!("batch-inbox-none-{}", std::process::id()));
        let err = write(&dir, &dir.join("out")).unwrap_err();
        assert!(matches!(&err, SummaryError::Io { path, .. } if path.ends_with("machine.json")));
    }
}

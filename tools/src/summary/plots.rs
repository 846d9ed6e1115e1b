//! The plots: throughput against batch size, the latency distributions of the fixed-rate runs,
//! and latency against the input rate per batch size.

use std::path::Path;

use plotters::prelude::*;

use super::{batch_of, best_rate, int, is_drain};
use crate::report::RunReport;

pub(super) type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

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
    plot_with(path, caption, axes, (lines, refs), &tick)
}

/// [`plot`] with `x_tick` labelling the x axis.
fn plot_with(
    path: &Path,
    caption: &str,
    axes: [&str; 2],
    (lines, refs): (Vec<Line>, Vec<Line>),
    x_tick: &dyn Fn(&f64) -> String,
) -> Drawn {
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
    mesh.x_label_formatter(x_tick).y_label_formatter(&tick);
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

pub(super) fn plot_throughput(runs: &[RunReport], path: &Path) -> Drawn {
    let keep = |r: &&RunReport| is_drain(r) && r.label.starts_with("batched-b");
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

/// One HdrHistogram percentile-distribution curve per fixed-rate run: x is 1/(1 − p), so 90%,
/// 99% and 99.9% are evenly spaced; the consume-only floors are included.
pub(super) fn plot_distribution(runs: &[RunReport], path: &Path) -> Drawn {
    let fixed = runs
        .iter()
        .filter(|r| !is_drain(r) && !r.e2e_distribution_ms.is_empty());
    let lines = fixed.enumerate().map(|(i, r)| {
        let pts = r.e2e_distribution_ms.iter().filter(|[p, _]| *p < 100.0);
        let pts = pts.map(|[p, v]| (100.0 / (100.0 - p), v.max(0.01)));
        Line(r.label.clone(), pts.collect(), color(i))
    });
    let axes = [
        "percentile (log of 1/(1 − p))",
        "end-to-end latency, ms (log)",
    ];
    let caption = "Latency distribution at a fixed rate (Kafka timestamp to COMMIT)";
    plot_with(
        path,
        caption,
        axes,
        (lines.collect(), Vec::new()),
        &percentile_tick,
    )
}

/// p99 against the input rate, one line per batch size (linger batching).
pub(super) fn plot_latency_vs_rate(runs: &[RunReport], path: &Path) -> Drawn {
    let sweep = |r: &&RunReport| !is_drain(r) && r.label.starts_with("latency-b");
    let mut sizes: Vec<u64> = runs.iter().filter(sweep).filter_map(batch_of).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let lines = sizes.iter().enumerate().map(|(i, size)| {
        let same = runs
            .iter()
            .filter(sweep)
            .filter(|r| batch_of(r) == Some(*size));
        let pts = same.map(|r| (r.input_rate.unwrap_or(1.0), r.e2e_latency_ms.p99.max(0.01)));
        Line(format!("batch {size}: p99"), pts.collect(), color(i))
    });
    let axes = [
        "input rate, msgs/s (log)",
        "end-to-end p99 latency, ms (log)",
    ];
    let caption = "Latency vs throughput, per batch size";
    plot(path, caption, axes, lines.collect(), Vec::new())
}

/// A percentile axis label for x = 1/(1 − p).
fn percentile_tick(x: &f64) -> String {
    let p = 100.0 * (1.0 - 1.0 / x.max(1.0));
    let s = format!("{p:.3}");
    format!("{}%", s.trim_end_matches('0').trim_end_matches('.'))
}

/// A distinct colour per line.
fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    PALETTE[i % PALETTE.len()]
}

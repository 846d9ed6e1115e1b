//! The soak (`scripts/loadtest.sh --soak`): one processor under a fixed input rate for many
//! minutes, watched from outside once a minute. `soak watch` samples what an operator's
//! monitoring would (the processor's `/metrics`, its CPU and RSS from `/proc`, PostgreSQL's
//! statistics views, the broker's CPU, the kernel's dirty pages) into a JSON line per sample
//! until the processor exits; `soak report` turns consecutive samples into a row per minute and
//! a plot.
//!
//! Invariant: a minute's latency figures come from the differences of the processor's own
//! Prometheus histograms between two samples, the counts exact and the quantiles interpolated
//! within a bucket as Prometheus's `histogram_quantile` does; the share of records above a
//! bucket's bound is exact.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cpu::{postgres_cpu_s, process_ticks, seconds, MachineTicks};
use crate::product_args::DbArgs;

/// `soak` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: SoakCommand,
}

/// `soak` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SoakCommand {
    /// Sample the processor and its database every --every until the processor exits.
    Watch(WatchArgs),
    /// A row per minute from the samples, as a Markdown table and an SVG plot.
    Report(SoakReportArgs),
}

/// `soak watch` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    /// The processor's --metrics-addr.
    #[arg(long)]
    pub metrics_addr: std::net::SocketAddr,
    /// The processor's pid: its CPU and RSS; the watch ends when it is gone.
    #[arg(long)]
    pub pid: u32,
    /// The broker's pid (its CPU), when it runs on this machine.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// Seconds between samples.
    #[arg(long, default_value_t = 60)]
    pub every: u64,
    /// The JSON lines to append the samples to.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: DbArgs,
}

/// `soak report` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakReportArgs {
    /// The samples (`soak watch --out`).
    #[arg(long)]
    pub samples: PathBuf,
    /// The Markdown table to write.
    #[arg(long)]
    pub table: PathBuf,
    /// The SVG plot to write.
    #[arg(long)]
    pub plot: PathBuf,
    /// A line of text put above the table (the run's settings).
    #[arg(long, default_value = "")]
    pub intro: String,
    /// The latency bound of the plot's dashed line and of the table's verdict column, in ms.
    #[arg(long, default_value_t = 50.0)]
    pub bound_ms: f64,
}

/// A cumulative Prometheus histogram: `(upper bound in seconds, count at or below)`, ascending,
/// `+Inf` left out (its count is `count`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Finite buckets.
    pub buckets: Vec<(f64, u64)>,
    /// Every observation (`_count`).
    pub count: u64,
}

impl Histogram {
    /// The histogram `name` (without `_bucket`) of a Prometheus text exposition, unlabelled.
    pub fn parse(text: &str, name: &str) -> Option<Self> {
        let bucket = format!("{name}_bucket{{le=\"");
        let count = format!("{name}_count ");
        let mut h = Self::default();
        let mut seen = false;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(&bucket) {
                let (le, n) = rest.split_once("\"} ")?;
                let n: u64 = n.trim().parse().ok()?;
                if le != "+Inf" {
                    h.buckets.push((le.parse().ok()?, n));
                }
            } else if let Some(n) = line.strip_prefix(&count) {
                h.count = n.trim().parse().ok()?;
                seen = true;
            }
        }
        seen.then_some(h)
    }

    /// The observations between `before` and `self` (the same buckets).
    pub fn since(&self, before: &Histogram) -> Histogram {
        let buckets = self
            .buckets
            .iter()
            .zip(before.buckets.iter().chain(std::iter::repeat(&(0.0, 0))))
            .map(|(&(le, n), &(_, m))| (le, n.saturating_sub(m)))
            .collect();
        Histogram {
            buckets,
            count: self.count.saturating_sub(before.count),
        }
    }

    /// The `q` quantile in ms, interpolated linearly within its bucket (`histogram_quantile`);
    /// in the `+Inf` bucket, the largest finite bound. `None` without observations.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q * self.count as f64;
        let (mut lo, mut below) = (0.0, 0u64);
        for &(le, n) in &self.buckets {
            if n as f64 >= rank {
                let inside = (n - below) as f64;
                let share = if inside > 0.0 {
                    (rank - below as f64) / inside
                } else {
                    1.0
                };
                return Some((lo + (le - lo) * share) * 1000.0);
            }
            (lo, below) = (le, n);
        }
        Some(lo * 1000.0)
    }

    /// The share (0–1) of observations above the largest bucket bound at or below `ms`, and that
    /// bound in ms: exact.
    pub fn share_above_ms(&self, ms: f64) -> Option<(f64, f64)> {
        let &(le, n) = self
            .buckets
            .iter()
            .rev()
            .find(|(le, _)| le * 1000.0 <= ms + 1e-9)?;
        (self.count > 0).then(|| ((self.count - n) as f64 / self.count as f64, le * 1000.0))
    }
}

/// One sample of the soak.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the watch started.
    pub t_s: f64,
    /// The record's timestamp to its COMMIT.
    pub e2e: Histogram,
    /// The record's timestamp to its arrival at its partition worker.
    pub receive: Histogram,
    /// The processor's CPU seconds.
    pub processor_cpu_s: f64,
    /// The processor's resident memory now, MiB.
    pub rss_mb: f64,
    /// PostgreSQL's CPU seconds (every process of the server).
    pub postgres_cpu_s: Option<f64>,
    /// The broker's CPU seconds.
    pub broker_cpu_s: Option<f64>,
    /// The machine's busy ticks.
    pub machine_busy: u64,
    /// The machine's ticks.
    pub machine_total: u64,
    /// Rows of `inbox` (the statistics' live tuples).
    pub inbox_rows: i64,
    /// `inbox` with its indexes and TOAST, MiB.
    pub inbox_mb: f64,
    /// Checkpoints so far (timed and requested).
    pub checkpoints: i64,
    /// WAL syncs so far (`pg_stat_wal`).
    pub wal_syncs: i64,
    /// Their time so far, ms (0 unless `track_wal_io_timing` is on).
    pub wal_sync_ms: f64,
    /// Autovacuum runs so far, per table of the database.
    pub autovacuums: BTreeMap<String, i64>,
    /// The kernel's dirty and under-write-back pages, the most seen since the last sample
    /// (read each second), MiB.
    pub dirty_mb_max: f64,
}

/// Runs a `soak` subcommand.
pub async fn run(args: SoakArgs) -> anyhow::Result<()> {
    match args.command {
        SoakCommand::Watch(a) => watch(a).await,
        SoakCommand::Report(a) => report(&a),
    }
}

async fn watch(args: WatchArgs) -> anyhow::Result<()> {
    let pool = batch_inbox::db::connect(args.db.database_url.expose(), 1).await?;
    let client = pool.get().await?;
    let postmaster = crate::cpu::postmaster(&**client).await;
    let started = Instant::now();
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
        .with_context(|| format!("opening {}", args.out.display()))?;
    let mut dirty_max = 0.0f64;
    let mut next = Duration::ZERO;
    loop {
        dirty_max = dirty_max.max(dirty_mb());
        if started.elapsed() >= next {
            // The processor exits once it committed its records: then the last sample is taken.
            let Some(cpu) = process_ticks(args.pid) else {
                return Ok(());
            };
            let metrics = match scrape(args.metrics_addr).await {
                Ok(m) => m,
                Err(_) if process_ticks(args.pid).is_none() => return Ok(()),
                Err(e) => return Err(e),
            };
            let mut s = Sample {
                t_s: started.elapsed().as_secs_f64(),
                e2e: Histogram::parse(&metrics, "batch_inbox_end_to_end_latency_seconds")
                    .context("no end-to-end latency histogram in /metrics")?,
                receive: Histogram::parse(&metrics, "batch_inbox_receive_latency_seconds")
                    .unwrap_or_default(),
                processor_cpu_s: seconds(cpu),
                rss_mb: rss_mb(args.pid),
                postgres_cpu_s: postmaster.and_then(postgres_cpu_s),
                broker_cpu_s: args.broker_pid.and_then(process_ticks).map(seconds),
                dirty_mb_max: dirty_max,
                ..Sample::default()
            };
            let m = MachineTicks::read();
            (s.machine_busy, s.machine_total) = (m.busy, m.total);
            database(&client, &mut s).await?;
            use std::io::Write;
            writeln!(out, "{}", serde_json::to_string(&s)?)?;
            out.flush()?;
            dirty_max = 0.0;
            next += Duration::from_secs(args.every.max(1));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The database's side of a sample.
async fn database(client: &tokio_postgres::Client, s: &mut Sample) -> anyhow::Result<()> {
    let row = client
        .query_one(
            "WITH t AS (SELECT relid, n_live_tup FROM pg_stat_user_tables
                        WHERE relname = 'inbox' OR relid IN
                          (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'inbox'::regclass))
             SELECT coalesce((SELECT sum(n_live_tup)::bigint FROM t), 0),
                    coalesce((SELECT sum(pg_total_relation_size(relid))::float8 FROM t), 0),
                    (SELECT (checkpoints_timed + checkpoints_req)::bigint FROM pg_stat_bgwriter),
                    (SELECT wal_sync::bigint FROM pg_stat_wal),
                    (SELECT wal_sync_time::float8 FROM pg_stat_wal)",
            &[],
        )
        .await
        .context("reading PostgreSQL's statistics")?;
    s.inbox_rows = row.get(0);
    s.inbox_mb = row.get::<_, f64>(1) / (1024.0 * 1024.0);
    s.checkpoints = row.get(2);
    s.wal_syncs = row.get(3);
    s.wal_sync_ms = row.get(4);
    for row in client
        .query(
            "SELECT relname::text, autovacuum_count FROM pg_stat_user_tables",
            &[],
        )
        .await?
    {
        s.autovacuums.insert(row.get(0), row.get(1));
    }
    Ok(())
}

/// GET /metrics over HTTP/1.0 (the connection closes after the body).
async fn scrape(addr: std::net::SocketAddr) -> anyhow::Result<String> {
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: soak\r\n\r\n")
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok::<_, std::io::Error>(body)
    };
    let text = tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .context("GET /metrics timed out")?
        .with_context(|| format!("GET http://{addr}/metrics"))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or(("", ""));
    anyhow::ensure!(
        head.starts_with("HTTP/1.") && head.split(' ').nth(1) == Some("200"),
        "GET http://{addr}/metrics: {}",
        head.lines().next().unwrap_or("no response")
    );
    Ok(body.to_owned())
}

/// VmRSS of `pid`, MiB (0 when gone).
fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    meminfo_kb(&status, "VmRSS:") / 1024.0
}

/// The kernel's Dirty plus Writeback, MiB.
fn dirty_mb() -> f64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    (meminfo_kb(&info, "Dirty:") + meminfo_kb(&info, "Writeback:")) / 1024.0
}

/// The kB figure of the line starting with `key` in a `/proc` status text.
fn meminfo_kb(text: &str, key: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// One minute (the span between two samples).
#[derive(Debug, Clone, PartialEq)]
pub struct Minute {
    /// Its end, minutes since the first sample.
    pub end_min: f64,
    /// Records committed.
    pub records: u64,
    /// Their rate, msgs/s.
    pub rate: f64,
    /// End-to-end p50 and p99, ms.
    pub p50_ms: Option<f64>,
    /// End-to-end p99, ms.
    pub p99_ms: Option<f64>,
    /// Receive p99, ms (before the processor has the record).
    pub receive_p99_ms: Option<f64>,
    /// The exact share above the bucket bound at or below the report's bound, and that bound.
    pub above: Option<(f64, f64)>,
    /// CPU µs per record: the processor, PostgreSQL, the broker.
    pub cpu_us: [Option<f64>; 3],
    /// The machine's busy share, %.
    pub machine_busy_pct: f64,
    /// RSS at its end, MiB.
    pub rss_mb: f64,
    /// Inbox rows and MiB at its end.
    pub inbox: (i64, f64),
    /// Checkpoints during it.
    pub checkpoints: i64,
    /// Autovacuum runs during it, by table.
    pub autovacuums: Vec<String>,
    /// WAL syncs during it and their mean time, ms.
    pub wal: (i64, Option<f64>),
    /// Most dirty and write-back MiB seen during it.
    pub dirty_mb_max: f64,
}

/// The minutes between consecutive samples.
pub fn minutes(samples: &[Sample], bound_ms: f64) -> Vec<Minute> {
    let Some(first) = samples.first() else {
        return Vec::new();
    };
    samples
        .windows(2)
        .map(|w| {
            let (a, b) = (&w[0], &w[1]);
            let e2e = b.e2e.since(&a.e2e);
            let receive = b.receive.since(&a.receive);
            let secs = (b.t_s - a.t_s).max(1e-9);
            let per_record = |x: Option<f64>, y: Option<f64>| {
                let n = e2e.count;
                x.zip(y)
                    .filter(|_| n > 0)
                    .map(|(x, y)| (y - x).max(0.0) * 1e6 / n as f64)
            };
            let machine = MachineTicks {
                busy: b.machine_busy,
                total: b.machine_total,
            }
            .busy_share_since(&MachineTicks {
                busy: a.machine_busy,
                total: a.machine_total,
            });
            let syncs = b.wal_syncs - a.wal_syncs;
            Minute {
                end_min: (b.t_s - first.t_s) / 60.0,
                records: e2e.count,
                rate: e2e.count as f64 / secs,
                p50_ms: e2e.quantile_ms(0.5),
                p99_ms: e2e.quantile_ms(0.99),
                receive_p99_ms: receive.quantile_ms(0.99),
                above: e2e.share_above_ms(bound_ms),
                cpu_us: [
                    per_record(Some(a.processor_cpu_s), Some(b.processor_cpu_s)),
                    per_record(a.postgres_cpu_s, b.postgres_cpu_s),
                    per_record(a.broker_cpu_s, b.broker_cpu_s),
                ],
                machine_busy_pct: machine * 100.0,
                rss_mb: b.rss_mb,
                inbox: (b.inbox_rows, b.inbox_mb),
                checkpoints: b.checkpoints - a.checkpoints,
                autovacuums: b
                    .autovacuums
                    .iter()
                    .filter(|(t, n)| **n > a.autovacuums.get(*t).copied().unwrap_or(0))
                    .map(|(t, _)| t.clone())
                    .collect(),
                wal: (
                    syncs,
                    (syncs > 0).then(|| (b.wal_sync_ms - a.wal_sync_ms) / syncs as f64),
                ),
                dirty_mb_max: b.dirty_mb_max,
            }
        })
        .collect()
}

fn report(args: &SoakReportArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.samples)
        .with_context(|| format!("reading {}", args.samples.display()))?;
    let samples: Vec<Sample> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("a sample that is not JSON")?;
    anyhow::ensure!(samples.len() >= 2, "fewer than two samples: no minute");
    let rows = minutes(&samples, args.bound_ms);
    std::fs::write(&args.table, table(&rows, &args.intro, args.bound_ms))
        .with_context(|| format!("writing {}", args.table.display()))?;
    draw(&args.plot, &rows, args.bound_ms)
        .map_err(|e| anyhow::anyhow!("drawing {}: {e}", args.plot.display()))?;
    Ok(())
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.decimals$}"))
}

/// The Markdown table of `rows`.
pub fn table(rows: &[Minute], intro: &str, bound_ms: f64) -> String {
    let mut md = String::from("# The soak, minute by minute\n\n");
    if !intro.is_empty() {
        md += intro;
        md += "\n\n";
    }
    let bucket = rows
        .iter()
        .find_map(|r| r.above.map(|a| a.1))
        .unwrap_or(bound_ms);
    md += &format!(
        "Latency from the processor's own histograms (`/metrics`), the difference between two \
         samples: p50 and p99 interpolated within a bucket as Prometheus's `histogram_quantile` \
         does. *> {bucket:.0} ms*: the exact share of the minute's records above {bucket:.0} ms, \
         the largest bucket bound at or below {bound_ms:.0} ms; at most 1% there proves p99 ≤ \
         {bound_ms:.0} ms. *receive p99*: the record's timestamp to its arrival at its \
         partition's worker (the producer, the broker and the client). CPU in µs per committed \
         record. *autovacuum*: the tables vacuumed during the minute. *ms/sync*: PostgreSQL's \
         mean WAL sync time (`track_wal_io_timing`). *dirty*: the kernel's Dirty + Writeback, \
         the most seen in the minute (read each second).\n\n"
    );
    md += &format!(
        "| min | records | msgs/s | p50 ms | p99 ms | receive p99 ms | > {bucket:.0} ms | \
         processor µs | PostgreSQL µs | broker µs | machine busy | RSS MiB | inbox rows | \
         inbox MiB | checkpoints | autovacuum | WAL syncs | ms/sync | dirty MiB |\n"
    );
    md += "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n";
    for r in rows {
        md += &format!(
            "| {:.1} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {:.1} | {} | {:.1} \
             | {} | {} | {} | {} | {:.1} |\n",
            r.end_min,
            r.records,
            r.rate,
            opt(r.p50_ms, 1),
            opt(r.p99_ms, 1),
            opt(r.receive_p99_ms, 1),
            r.above
                .map_or("-".into(), |(s, _)| format!("{:.2}%", s * 100.0)),
            opt(r.cpu_us[0], 1),
            opt(r.cpu_us[1], 1),
            opt(r.cpu_us[2], 1),
            r.machine_busy_pct,
            r.rss_mb,
            r.inbox.0,
            r.inbox.1,
            r.checkpoints,
            if r.autovacuums.is_empty() {
                "-".into()
            } else {
                r.autovacuums.join(", ")
            },
            r.wal.0,
            opt(r.wal.1, 2),
            r.dirty_mb_max,
        );
    }
    let full: Vec<&Minute> = rows.iter().filter(|r| r.records > 0).collect();
    let over = full
        .iter()
        .filter(|r| r.p99_ms.is_some_and(|p| p > bound_ms))
        .count();
    md += &format!(
        "\nMinutes with records: {}; p99 above {bound_ms:.0} ms (interpolated) in {over} of them.\n",
        full.len()
    );
    md
}

type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// p99 and receive p99 per minute with the bound dashed (top), RSS and inbox MiB (bottom).
fn draw(path: &Path, rows: &[Minute], bound_ms: f64) -> Drawn {
    let root = SVGBackend::new(path, (900, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(360);
    let x_max = rows.last().map_or(1.0, |r| r.end_min).max(1.0);
    let points = |f: &dyn Fn(&Minute) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|r| f(r).map(|v| (r.end_min, v)))
            .collect()
    };
    let p99 = points(&|r| r.p99_ms);
    let receive = points(&|r| r.receive_p99_ms);
    let y_max = p99
        .iter()
        .chain(&receive)
        .map(|p| p.1)
        .fold(bound_ms, f64::max)
        * 1.2;
    let bound = vec![(0.0, bound_ms), (x_max, bound_ms)];
    panel(
        &top,
        ("End-to-end p99 per minute", "ms"),
        (x_max, y_max),
        vec![
            ("p99: timestamp to COMMIT".into(), p99, BLUE.stroke_width(2)),
            (
                "p99: timestamp to arrival at the worker".into(),
                receive,
                RED.stroke_width(1),
            ),
        ],
        Some((format!("{bound_ms:.0} ms"), bound)),
    )?;
    let rss = points(&|r| Some(r.rss_mb));
    let inbox = points(&|r| Some(r.inbox.1));
    let m_max = rss.iter().chain(&inbox).map(|p| p.1).fold(1.0, f64::max) * 1.2;
    panel(
        &bottom,
        ("Processor RSS and inbox size", "MiB"),
        (x_max, m_max),
        vec![
            ("processor RSS".into(), rss, GREEN.stroke_width(2)),
            (
                "inbox (table and indexes)".into(),
                inbox,
                MAGENTA.stroke_width(2),
            ),
        ],
        None,
    )?;
    root.present()
}

/// A legend entry, its points and its style.
type Series = (String, Vec<(f64, f64)>, ShapeStyle);

/// One chart of `area` over minutes: `lines`, and a dashed horizontal when given.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    (caption, unit): (&str, &str),
    (x_max, y_max): (f64, f64),
    lines: Vec<Series>,
    dashed: Option<(String, Vec<(f64, f64)>)>,
) -> Drawn {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc(unit)
        .draw()?;
    let mark = |style: ShapeStyle| move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style);
    for (label, points, style) in lines {
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(label)
            .legend(mark(style));
    }
    if let Some((label, points)) = dashed {
        let style = BLACK.stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new(points, 6, 4, style))?
            .label(label)
            .legend(mark(style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "# TYPE batch_inbox_end_to_end_latency_seconds histogram
batch_inbox_end_to_end_latency_seconds_sum 12.5
batch_inbox_end_to_end_latency_seconds_count 1000
batch_inbox_end_to_end_latency_seconds_bucket{le=\"0.016\"} 900
batch_inbox_end_to_end_latency_seconds_bucket{le=\"0.032\"} 980
batch_inbox_end_to_end_latency_seconds_bucket{le=\"0.064\"} 995
batch_inbox_end_to_end_latency_seconds_bucket{le=\"+Inf\"} 1000
batch_inbox_end_to_end_latency_seconds_created 1.0
";

    #[test]
    fn a_histogram_is_read_from_the_exposition_and_its_quantiles_interpolated() {
        let h = Histogram::parse(METRICS, "batch_inbox_end_to_end_latency_seconds").unwrap();
        assert_eq!(h.count, 1000);
        assert_eq!(h.buckets, vec![(0.016, 900), (0.032, 980), (0.064, 995)]);
        // Rank 500 of 900 in the first bucket: 16 ms × 500/900.
        assert!((h.quantile_ms(0.5).unwrap() - 16.0 * 500.0 / 900.0).abs() < 1e-9);
        // Rank 990: 10 of the 15 records between 32 and 64 ms.
        assert!((h.quantile_ms(0.99).unwrap() - (32.0 + 32.0 * 10.0 / 15.0)).abs() < 1e-9);
        // Rank 999 is in +Inf: the largest finite bound.
        assert_eq!(h.quantile_ms(0.999), Some(64.0));
        // Above 50 ms: the bucket bound at or below it is 32 ms, and 20 records lie above it.
        assert_eq!(h.share_above_ms(50.0), Some((0.02, 32.0)));
        assert_eq!(h.share_above_ms(1.0), None);
        assert!(Histogram::parse(METRICS, "batch_inbox_receive_latency_seconds").is_none());
    }

    #[test]
    fn a_minute_is_the_difference_of_two_samples() {
        let h = Histogram::parse(METRICS, "batch_inbox_end_to_end_latency_seconds").unwrap();
        let a = Sample {
            t_s: 0.0,
            e2e: h.clone(),
            processor_cpu_s: 1.0,
            postgres_cpu_s: Some(2.0),
            autovacuums: [("inbox".to_owned(), 1), ("balances".to_owned(), 0)].into(),
            wal_syncs: 10,
            wal_sync_ms: 5.0,
            ..Sample::default()
        };
        let mut later = h.clone();
        for (b, add) in later.buckets.iter_mut().zip([100, 100, 100]) {
            b.1 += add;
        }
        later.count += 100;
        let b = Sample {
            t_s: 60.0,
            e2e: later,
            processor_cpu_s: 1.5,
            postgres_cpu_s: Some(2.2),
            autovacuums: [("inbox".to_owned(), 2), ("balances".to_owned(), 0)].into(),
            wal_syncs: 20,
            wal_sync_ms: 25.0,
            rss_mb: 30.0,
            ..Sample::default()
        };
        let m = minutes(&[a, b], 50.0);
        assert_eq!(m.len(), 1);
        let m = &m[0];
        assert_eq!((m.records, m.end_min), (100, 1.0));
        assert!((m.rate - 100.0 / 60.0).abs() < 1e-9);
        // All 100 records of the minute at or below 16 ms.
        assert_eq!(m.above, Some((0.0, 32.0)));
        assert!(m.p99_ms.unwrap() <= 16.0);
        assert_eq!(m.cpu_us[0], Some(5000.0));
        assert!((m.cpu_us[1].unwrap() - 2000.0).abs() < 1e-6);
        assert_eq!(m.cpu_us[2], None);
        assert_eq!(m.autovacuums, vec!["inbox".to_owned()]);
        assert_eq!(m.wal, (10, Some(2.0)));
        let md = table(std::slice::from_ref(m), "intro", 50.0);
        assert!(md.contains("| 1.0 | 100 | 2 |"), "{md}");
        assert!(
            md.contains("p99 above 50 ms (interpolated) in 0 of them"),
            "{md}"
        );
    }
}

//! One load-test run, measured from outside the processor: `drain` starts a processor command
//! (normally `batch-inbox run …`) with `--stats-file`, stops it with SIGTERM once it committed N
//! records when asked (fixed-rate runs), checks the database against the model and writes the
//! run's [`RunReport`]. `consume-only` is the load test's broker-and-client ceiling: the same
//! pipeline with no database work at all.
//!
//! Invariant: the processor is observed only through the product's documented interfaces (its
//! stats file, its exit status and the database), as any user's tooling would.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::product_args::{DbArgs, KafkaArgs, PipelineArgs};
use anyhow::Context;
use batch_inbox::internals::stats_file::StatsFile;
use batch_inbox::stats_file::RunSettings;
use batch_inbox::stats_file::StatsReport;
use batch_inbox::KafkaSettings;
use batch_inbox::Stats;

use crate::report::{read_stats, RunReport};

/// `drain` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DrainArgs {
    /// Name of the run in its report.
    #[arg(long)]
    pub label: String,
    /// Where to write the run's report (JSON).
    #[arg(long)]
    pub report: PathBuf,
    /// After the run, compare the database with this expected outcome (from `produce
    /// --expect`); the run fails when they differ.
    #[arg(long)]
    pub expect: Option<PathBuf>,
    /// With --expect: compare the balances with the sums of every new entry, without the
    /// ledger's rules (a run of the SQL handler's `balances_upsert.sql`).
    #[arg(long, requires = "expect")]
    pub sums: bool,
    /// Producer rate of the input, recorded in the report (fixed-rate runs).
    #[arg(long)]
    pub input_rate: Option<f64>,
    /// Stop the processor (SIGTERM: it finishes its batches) once it committed this many records.
    #[arg(long, value_name = "N", conflicts_with = "processes")]
    pub stop_after: Option<u64>,
    /// Runs this many copies of the command at once, in one consumer group (scale-out). The
    /// report then sums their counters and CPU, takes the largest peak RSS, and measures msgs/s
    /// from the first start to the last exit, the only window the copies share.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub processes: u32,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: DbArgs,
    /// The processor command and its arguments; `--stats-file` is added.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Runs `args.command`, then checks and reports; fails when the processor or the check fails.
pub async fn drain(args: DrainArgs) -> anyhow::Result<()> {
    let pool = batch_inbox::db::connect(args.db.database_url.expose(), 1).await?;
    let before = crate::measure::statement_count(&pool).await;
    let postmaster = crate::cpu::postmaster(&**pool.get().await?).await;
    let pg_before = postmaster.and_then(crate::cpu::postgres_cpu_s);
    let stats = if args.processes == 1 {
        let stats_path = with_suffix(&args.report, ".stats");
        run_processor(&args.command, &stats_path, args.stop_after).await?;
        let stats = read_stats(&stats_path)
            .with_context(|| format!("reading the stats file {}", stats_path.display()))?;
        let _ = std::fs::remove_file(&stats_path);
        stats
    } else {
        scale_out(&args.command, &args.report, args.processes).await?
    };
    // Read before the check below, whose queries are not the run's.
    let pg_after = postmaster.and_then(crate::cpu::postgres_cpu_s);
    let mut report = RunReport {
        label: args.label.clone(),
        run: stats,
        input_rate: args.input_rate,
        postgres_cpu_s: pg_before.zip(pg_after).map(|(a, b)| (b - a).max(0.0)),
        ..RunReport::default()
    };
    if let (Some(b), Some(a)) = (before, crate::measure::statement_count(&pool).await) {
        report.statements_per_msg = Some((a - b) as f64 / report.stats.records.max(1) as f64);
    }
    // Read only now: a fixed-rate run's producer writes the file while the processor runs.
    let diffs = match &args.expect {
        Some(path) => {
            let mut expected = crate::verify::read_expected(path)?;
            if args.sums {
                expected = expected.summed();
            }
            let observed = crate::verify::observe(&**pool.get().await?).await?;
            let diffs = crate::verify::differences(&observed, &expected);
            report.verified = Some(diffs.is_empty());
            diffs
        }
        None => Vec::new(),
    };
    batch_inbox::internals::stats_file::write_atomically(&args.report, &report)
        .with_context(|| format!("writing {}", args.report.display()))?;
    if !diffs.is_empty() {
        anyhow::bail!(
            "database differs from the expected outcome: {}",
            diffs.join("; ")
        );
    }
    Ok(())
}

/// Runs `processes` copies of `command` at once and merges their stats files.
async fn scale_out(
    command: &[String],
    report: &Path,
    processes: u32,
) -> anyhow::Result<StatsReport> {
    let started = std::time::Instant::now();
    let paths: Vec<PathBuf> = (0..processes)
        .map(|i| with_suffix(report, &format!(".stats.{i}")))
        .collect();
    let runs = paths.iter().map(|p| run_processor(command, p, None));
    for result in futures::future::join_all(runs).await {
        result?;
    }
    let wall = started.elapsed().as_secs_f64();
    let mut merged: Option<StatsReport> = None;
    for path in &paths {
        let one = read_stats(path)
            .with_context(|| format!("reading the stats file {}", path.display()))?;
        let _ = std::fs::remove_file(path);
        merged = Some(match merged {
            None => one,
            Some(all) => merge(all, one)?,
        });
    }
    let mut merged = merged.context("no process ran")?;
    merged.msgs_per_sec = merged.stats.records as f64 / wall.max(1e-9);
    merged.measured.window_s = wall;
    Ok(merged)
}

/// `a` with `b`'s counters and CPU added, the larger peak RSS, and `a`'s distributions (the
/// copies see the same traffic, so one copy's latency stands for all).
fn merge(mut a: StatsReport, b: StatsReport) -> anyhow::Result<StatsReport> {
    let mut counters = serde_json::to_value(a.stats)?;
    let theirs = serde_json::to_value(b.stats)?;
    if let (Some(mine), Some(theirs)) = (counters.as_object_mut(), theirs.as_object()) {
        for (name, value) in mine.iter_mut() {
            let sum = value
                .as_u64()
                .zip(theirs.get(name).and_then(|v| v.as_u64()));
            if let Some((x, y)) = sum {
                *value = (x.saturating_add(y)).into();
            }
        }
    }
    a.stats = serde_json::from_value(counters)?;
    a.cpu_s += b.cpu_s;
    a.peak_rss_mb = a.peak_rss_mb.max(b.peak_rss_mb);
    Ok(a)
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}

/// Runs the processor command with a stats file; stops it once `stop_after` records committed.
async fn run_processor(
    command: &[String],
    stats: &Path,
    stop_after: Option<u64>,
) -> anyhow::Result<()> {
    let (program, rest) = command.split_first().context("no processor command")?;
    let mut child = tokio::process::Command::new(program)
        .args(rest)
        .arg("--stats-file")
        .arg(stats)
        .args(["--stats-interval", "100ms"])
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let mut stopped = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status?,
            _ = tokio::time::sleep(Duration::from_millis(100)), if !stopped => {
                let done = stop_after.is_some_and(|n| {
                    read_stats(stats).is_ok_and(|s| s.stats.records >= n)
                });
                if done {
                    terminate(&child);
                    stopped = true;
                }
            }
        }
    };
    if !status.success() {
        anyhow::bail!("the processor failed: {status}");
    }
    Ok(())
}

/// Asks `child` to stop as an operator would: SIGTERM.
fn terminate(child: &tokio::process::Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) with a pid this process spawned and has not reaped; no memory involved.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C: the processor then finishes its batches and returns.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// `consume-only` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsumeOnlyArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: DbArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub kafka: KafkaArgs,
    /// Consumer group (its offsets are stored: use a group of its own).
    #[arg(long)]
    pub group: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub pipeline: PipelineArgs,
    /// Where to write the run's stats (the format of `batch-inbox run --stats-file`).
    #[arg(long)]
    pub stats_file: PathBuf,
    /// How often the stats file is rewritten.
    #[arg(long, default_value = "1s", value_parser = batch_inbox::internals::names::parse_interval)]
    pub stats_interval: Duration,
    /// Keep consuming until SIGTERM or Ctrl-C (fixed-rate runs start on an empty topic) instead
    /// of exiting once the topic is drained.
    #[arg(long)]
    pub follow: bool,
}

/// Drains the topic with the pipeline's consume-only mode (no database work) and writes stats.
pub async fn consume_only(args: ConsumeOnlyArgs) -> anyhow::Result<()> {
    let pool = batch_inbox::db::connect(args.db.database_url.expose(), 1).await?;
    let mut kafka = KafkaSettings::new(&args.kafka.brokers, args.kafka.topic(), &args.group);
    kafka.overrides = args.kafka.properties.clone();
    kafka.partition_eof = !args.follow;
    let mut config = args.pipeline.processor(kafka, !args.follow);
    config.worker = config.worker.only_consume();
    // Nothing is written to the database: the group's position is Kafka's alone.
    config.offsets_in_db = false;
    let stats = Arc::new(Stats::with_report());
    let settings = RunSettings {
        mode: "consume-only".to_owned(),
        batch_size: args.pipeline.batch_size.get() as u64,
        linger_ms: args.pipeline.linger_ms(),
        pool_size: args.pipeline.pool_size.get() as u64,
        handler: String::new(),
    };
    let file = StatsFile::start(
        args.stats_file,
        settings,
        stats.clone(),
        args.stats_interval,
    );
    let handler = Arc::new(batch_inbox::ledger::Ledger);
    let result =
        batch_inbox::run_with_stats(config, pool, handler, stats.clone(), stop_signal()).await;
    file.finish().await?;
    result?;
    let s = stats.snapshot();
    println!("records {} (consume-only)", s.records);
    Ok(())
}

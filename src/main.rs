//! The `batch-inbox` binary: parses the command line and calls the library.

use std::sync::Arc;

use anyhow::Context;
use batch_inbox::config::{Command, CopyCeilingArgs, DemoArgs, ProduceArgs, RunArgs, VerifyArgs};
use batch_inbox::config_file::{self, ConfigError, Source};
use batch_inbox::generate::Expected;
use batch_inbox::measure;
use batch_inbox::metrics::{RunReport, RunSettings};
use batch_inbox::retention::{CleanupCommandArgs, MigrateArgs};
use batch_inbox::stats::Stats;
use batch_inbox::{db, ledger::Ledger, retention};
use clap::ValueEnum;
use tokio_util::sync::CancellationToken;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let loaded = match config_file::load(std::env::args_os()) {
        Ok(loaded) => loaded,
        Err(ConfigError::Cli(e)) => config_file::hide_stray_value(e).exit(),
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // Failpoints (fault tests only) are configured by the FAILPOINTS environment variable.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    batch_inbox::logging::init(loaded.cli.log_format);
    let result = match loaded.cli.command {
        Command::Migrate(args) => migrate(args).await,
        Command::Cleanup(args) => cleanup(args).await,
        Command::Run(args) if args.ops.print_config => {
            print_settings(&loaded.settings);
            Ok(())
        }
        Command::Run(args) => match args.processor().kafka.check(args.offsets_in_db) {
            Ok(()) => run(*args).await,
            Err(refused) => {
                eprintln!("error: {refused}");
                return std::process::ExitCode::from(2);
            }
        },
        Command::Produce(args) => produce(args).await,
        Command::Demo(args) => demo(args).await,
        Command::Verify(args) => verify(args).await,
        Command::Summary(args) => batch_inbox::summary::write(&args.input, &args.output)
            .map(|files| files.iter().for_each(|f| println!("wrote {}", f.display())))
            .map_err(Into::into),
        Command::CopyCeiling(args) => copy_ceiling(args).await,
        Command::Chaos(args) => return chaos(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let pool = db::connect(args.db.database_url.expose(), 1).await?;
    let applied = db::migrate(&pool).await?;
    println!("migrations applied: {applied:?}");
    if args.partitioned {
        let today = retention::days::day_of_millis(retention::days::unix_millis(
            std::time::SystemTime::now(),
        ));
        let mut client = pool.get().await?;
        match retention::partition::convert(&mut client, today, args.partitions_ahead).await? {
            Some(c) => println!(
                "inbox partitioned by message_id: {} rows kept, {} daily partitions and a default",
                c.rows, c.partitions
            ),
            None => println!("inbox already partitioned"),
        }
    }
    Ok(())
}

async fn cleanup(args: CleanupCommandArgs) -> anyhow::Result<()> {
    let pool = db::connect(args.db.database_url.expose(), 1).await?;
    db::check_schema(&pool).await?;
    let settings = args.cleanup.settings(args.retention);
    let stop = tokio_util::sync::CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    let now = std::time::SystemTime::now();
    let report = retention::cleanup(&pool, &settings, now, &stop).await?;
    println!("{report}");
    Ok(())
}

/// The background retention task of `run`, stopped when the processor stops.
struct Maintenance {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Prepares the partitions ahead before anything is consumed (partitioned inbox), then starts the
/// background retention task when it has work: a cleanup (`--retention`) or partitions to prepare
/// day after day. Warns when the topic outlives the inbox retention.
async fn start_maintenance(
    args: &RunArgs,
    pool: &deadpool_postgres::Pool,
) -> anyhow::Result<Option<Maintenance>> {
    let expire = args.retention.is_some();
    if let Some(window) = args.retention.or(args.dedup_window) {
        retention::topic::warn_if_topic_outlives(&args.processor().kafka, window).await;
    }
    let layout = retention::partition::layout(&pool.get().await?).await?;
    if !expire && layout == retention::Layout::Plain {
        return Ok(None);
    }
    let settings = args.cleanup.settings(args.retention.unwrap_or_default());
    let now = std::time::SystemTime::now();
    let (created, postponed) = retention::prepare_partitions(pool, &settings, now).await?;
    if !created.is_empty() || !postponed.is_empty() {
        tracing::info!(?created, ?postponed, "inbox partitions prepared");
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let interval = std::time::Duration::from_secs(args.cleanup_interval_s);
    let task = tokio::spawn(retention::maintain(
        pool.clone(),
        settings,
        expire,
        interval,
        stop.clone(),
    ));
    Ok(Some(Maintenance { stop, task }))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let pool = db::connect(args.db.database_url.expose(), args.pipeline.pool_size.get()).await?;
    db::check_schema(&pool).await?;
    let statements_before = match args.report {
        Some(_) => measure::statement_count(&pool).await,
        None => None,
    };
    let maintenance = start_maintenance(&args, &pool).await?;
    let started = std::time::Instant::now();
    let stats = Arc::new(Stats::default());
    let progress = match (&args.report, args.report_every_ms) {
        (Some(path), Some(ms)) => Some(batch_inbox::progress::spawn_writer(
            path.clone(),
            args.label.clone(),
            stats.clone(),
            std::time::Duration::from_millis(ms.max(1)),
        )),
        _ => None,
    };
    let result = process(&args, &pool, stats.clone()).await;
    if let Some(writer) = progress {
        writer.abort();
    }
    if let Some(m) = maintenance {
        m.stop.cancel();
        if let Err(e) = m.task.await {
            tracing::warn!("retention task: {e}");
        }
    }
    result?;
    let s = stats.snapshot();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "records {} new {} duplicates {} dead-lettered {} (invalid {}, rejected {}) transactions {} retries {} in {secs:.1}s",
        s.records, s.new, s.duplicates, s.invalid + s.rejected, s.invalid, s.rejected, s.transactions, s.retries
    );
    println!(
        "poisoned {} (failed attempts {}) replays avoided {} offsets refused {}",
        s.poisoned, s.poison_failures, s.replays_avoided, s.offsets_refused
    );
    let mut report = stats.metrics.report(&args.label, s);
    if let (Some(before), Some(after)) = (statements_before, measure::statement_count(&pool).await)
    {
        report.statements_per_msg = Some((after - before) as f64 / s.records.max(1) as f64);
    }
    let p = &args.pipeline;
    report.settings = RunSettings {
        mode: p
            .mode
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned()),
        batch_size: p.batch_size.get() as u64,
        linger_ms: p.batch_linger_ms,
        pool_size: p.pool_size.get() as u64,
        rate: args.input_rate,
    };
    let mut failure = None;
    // Read only now: a fixed-rate run's producer writes the file while this processor runs.
    if let Some(path) = &args.expect {
        let diffs = verify_against(&pool, &read_expected(path)?).await?;
        report.verified = Some(diffs.is_empty());
        if !diffs.is_empty() {
            failure = Some(diffs.join("; "));
        }
    }
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    match failure {
        None => Ok(()),
        Some(diffs) => anyhow::bail!("database differs from the expected outcome: {diffs}"),
    }
}

/// Runs the ledger processor, with the operations listener and the summary lines beside it.
async fn process(
    args: &RunArgs,
    pool: &deadpool_postgres::Pool,
    stats: Arc<Stats>,
) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let stop_ops = stop.clone().drop_guard();
    let config = args.processor();
    // Before the listener starts: no scrape of an unsafe run reads 0.
    let switches = batch_inbox::processor::unsafe_switches(&config.worker);
    stats.telemetry.set_unsafe_mode(&switches);
    if let Some(addr) = args.ops.metrics_addr {
        let url = args.db.database_url.expose();
        batch_inbox::exporter::start(addr, url, pool.clone(), stats.clone(), stop.clone()).await?;
    }
    let summary = batch_inbox::logging::summary_loop(stats.clone(), args.ops.log_interval, stop);
    let summary = tokio::spawn(summary);
    let result = batch_inbox::processor::run_with_stats(
        config,
        pool.clone(),
        Arc::new(Ledger),
        stats.clone(),
        shutdown_signal(),
    )
    .await;
    drop(stop_ops); // the last summary line covers the run's end
    let _ = summary.await;
    Ok(result?)
}

/// `run --print-config`: every setting as a TOML line, with where it came from.
fn print_settings(settings: &[(String, String, Source)]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for (name, value, source) in settings {
        let source = match source {
            Source::Flag => "flag",
            Source::Env => "env",
            Source::File => "file",
            Source::Default => "default",
        };
        if writeln!(out, "{name} = {value:?}  # {source}").is_err() {
            return; // stdout closed (a pipe to `head`)
        }
    }
}

fn read_expected(path: &std::path::Path) -> anyhow::Result<Expected> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
}

async fn verify_against(
    pool: &deadpool_postgres::Pool,
    expected: &Expected,
) -> anyhow::Result<Vec<String>> {
    let observed = batch_inbox::verify::observe(&**pool.get().await?).await?;
    Ok(batch_inbox::verify::differences(&observed, expected))
}

async fn produce(args: ProduceArgs) -> anyhow::Result<()> {
    let brokers = &args.kafka.brokers;
    batch_inbox::produce::ensure_topic(brokers, &args.kafka.topic, args.partitions)
        .await
        .context("creating the topic")?;
    let (records, expected) = batch_inbox::generate::generate(args.generator.settings());
    let producer = batch_inbox::produce::producer(brokers, &args.kafka.properties)?;
    let started = std::time::Instant::now();
    let mut progress = Progress::new(records.len() as u64);
    let sent =
        batch_inbox::produce::send_paced(&producer, &args.kafka.topic, records, args.rate, |n| {
            progress.update(n)
        })
        .await?;
    progress.finish();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "produced {sent} records in {secs:.1}s ({:.0}/s)",
        sent as f64 / secs
    );
    if let Some(path) = args.expect {
        std::fs::write(&path, serde_json::to_vec_pretty(&expected)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A progress bar on a terminal; a plain line at every quarter otherwise.
enum Progress {
    Bar(indicatif::ProgressBar),
    Lines { total: u64, next: u64 },
}

impl Progress {
    fn new(total: u64) -> Self {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {per_sec} eta {eta}")
                    .expect("static template is valid"),
            );
            Progress::Bar(bar)
        } else {
            Progress::Lines {
                total,
                next: total / 4,
            }
        }
    }

    fn update(&mut self, delivered: u64) {
        match self {
            Progress::Bar(bar) => bar.set_position(delivered),
            Progress::Lines { total, next } => {
                if delivered >= *next && *next < *total {
                    eprintln!("delivered {delivered} of {total}");
                    *next += (*total / 4).max(1);
                }
            }
        }
    }

    fn finish(self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let pool = db::connect(args.db.database_url.expose(), args.pipeline.pool_size.get()).await?;
    db::migrate(&pool).await?;
    let client = pool.get().await?;
    client
        .batch_execute("TRUNCATE inbox, dead_letters, balances")
        .await?;
    drop(client);
    let pipeline = args.pipeline.clone();
    let report = batch_inbox::demo::run(pool, args.generator.settings(), args.partitions, |k| {
        pipeline.processor(k, true)
    })
    .await?;
    let s = report.stats;
    let e = &report.expected;
    let secs = report.elapsed.as_secs_f64();
    println!(
        "mode            {:?}, batch size {}",
        args.pipeline.mode, args.pipeline.batch_size
    );
    println!("messages        {}", s.records);
    println!("new (applied)   {}", s.new - s.rejected);
    println!("duplicates      {}", s.duplicates);
    println!(
        "dead-lettered   {} (bad input {}, insufficient funds {})",
        s.invalid + s.rejected,
        s.invalid,
        s.rejected
    );
    println!("transactions    {}", s.transactions);
    println!(
        "elapsed         {secs:.2}s including the group join ({:.0} msgs/s)",
        s.records as f64 / secs
    );
    println!("sum of balances {}", e.total());
    if report.differences.is_empty() {
        println!(
            "verified        database equals the model: {} inbox ids, {} balances",
            e.new,
            e.balances.len()
        );
        Ok(())
    } else {
        anyhow::bail!(
            "database differs from the model: {}",
            report.differences.join("; ")
        )
    }
}

async fn verify(args: VerifyArgs) -> anyhow::Result<()> {
    let expected = read_expected(&args.expect)?;
    let pool = db::connect(args.db.database_url.expose(), 1).await?;
    let diffs = verify_against(&pool, &expected).await?;
    if !diffs.is_empty() {
        anyhow::bail!("FAIL: {}", diffs.join("; "));
    }
    println!(
        "PASS: {} inbox ids, {} dead letters, {} balances summing to {}",
        expected.new,
        expected.dead_letters.values().sum::<u64>(),
        expected.balances.len(),
        expected.total()
    );
    Ok(())
}

async fn copy_ceiling(args: CopyCeilingArgs) -> anyhow::Result<()> {
    let pool = db::connect(args.db.database_url.expose(), args.streams.max(1)).await?;
    let (rows, secs) = measure::copy_ceiling(&pool, args.streams).await?;
    let rate = rows as f64 / secs.max(1e-9);
    println!(
        "COPY {rows} ids in {secs:.2}s ({rate:.0}/s) over {} streams",
        args.streams
    );
    if let Some(path) = &args.report {
        let report = RunReport {
            label: "copy-ceiling".to_owned(),
            settings: RunSettings {
                mode: "copy".to_owned(),
                pool_size: args.streams as u64,
                ..RunSettings::default()
            },
            window_s: secs,
            msgs_per_sec: rate,
            stats: batch_inbox::stats::StatsSnapshot {
                records: rows,
                ..Default::default()
            },
            ..RunReport::default()
        };
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `chaos`: exit 0 on PASS, 1 when an invariant is violated, 2 when the run itself failed.
async fn chaos(args: batch_inbox::chaos::ChaosArgs) -> std::process::ExitCode {
    match batch_inbox::chaos::run(args).await {
        Ok(report) if report.passed => std::process::ExitCode::SUCCESS,
        Ok(_) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("error: chaos run failed: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested: finishing in-flight batches");
}

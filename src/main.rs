//! The `batch-inbox` binary: parses the command line and calls the library.

use std::sync::Arc;

use batch_inbox::stats_file::RunSettings;
use batch_inbox::Stats;
use batch_inbox::{
    db, ledger, ledger::Ledger, redrive, retention, DbError, Handler, SqlHandler, SqlStatement,
};
use clap::ValueEnum;
use tokio_util::sync::CancellationToken;

mod cli;

use cli::commands::{Command, RunArgs};
use cli::config_file::{self, ConfigError, Source};
use cli::dead_letters::{DeadLettersCommand, ListArgs, RedriveArgs};
use cli::handler::{ApplySql, HandlerArgs, HandlerKind};
use cli::positions::{PositionsCommand, SetArgs};
use cli::retention::{CleanupCommandArgs, MigrateArgs};

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
    cli::logging::init(loaded.cli.log_format);
    let result = match loaded.cli.command {
        Command::Migrate(args) => migrate(args).await,
        Command::Cleanup(args) => cleanup(args).await,
        Command::DeadLetters(d) => match d.command {
            DeadLettersCommand::List(args) => list(args).await,
            DeadLettersCommand::Redrive(args) => match args.handler.check() {
                Ok(()) => redrive(*args).await,
                Err(refused) => {
                    eprintln!("error: {refused}");
                    return std::process::ExitCode::from(2);
                }
            },
        },
        Command::Positions(p) => match p.command {
            PositionsCommand::Set(args) => set_positions(*args).await,
        },
        Command::Run(args) if args.ops.print_config => {
            print_settings(&loaded.settings);
            Ok(())
        }
        Command::Run(args) => match args.check_handler().and_then(|()| {
            args.processor()
                .kafka
                .check(args.offsets_in_db)
                .map_err(|e| e.to_string())
        }) {
            Ok(()) => run(*args).await,
            Err(refused) => {
                eprintln!("error: {refused}");
                return std::process::ExitCode::from(2);
            }
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", batch_inbox::one_line_error(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn set_positions(args: SetArgs) -> anyhow::Result<()> {
    use batch_inbox::positions;
    let pool = db::connect(args.db.database_url.expose(), 1).await?;
    db::check_schema(&pool).await?;
    let (kafka, target) = (args.kafka(), args.target());
    let topic = args.kafka.topic();
    let changes = positions::plan(&kafka, &pool, topic, &args.partitions, target).await?;
    print!("{}", positions::table(&changes));
    if args.dry_run {
        println!("dry run: nothing moved ({target}, group {})", args.group);
        return Ok(());
    }
    positions::apply(&pool, &args.group, &changes, target, &args.reason).await?;
    println!(
        "moved {} partition(s) of group {} ({target}); recorded in consumer_offset_changes",
        changes.len(),
        args.group
    );
    Ok(())
}

async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let pool = db::connect(args.db.database_url.expose(), 1).await?;
    let applied = db::migrate(&pool).await?;
    println!("core migrations applied: {applied:?}");
    if args.handler == HandlerKind::Ledger {
        let applied = ledger::migrate(&pool).await?;
        println!("ledger migrations applied: {applied:?}");
    }
    if args.partitioned {
        let today = batch_inbox::days::day_of_millis(batch_inbox::days::unix_millis(
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
    db::check_grants(&pool, "cleanup", &[db::Uses::SchemaVersions]).await?;
    db::check_schema(&pool).await?;
    let uses = [db::Uses::Retention, db::Uses::PartitionUpkeep];
    db::check_grants(&pool, "cleanup", &uses).await?;
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

async fn list(args: ListArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let pool = db::connect(args.db.database_url.expose(), 1).await?;
    let command = "dead-letters list";
    db::check_grants(&pool, command, &[db::Uses::SchemaVersions]).await?;
    db::check_schema(&pool).await?;
    db::check_grants(&pool, command, &[db::Uses::ReadDeadLetters]).await?;
    let letters = redrive::list(&pool, &args.filter()).await?;
    let mut out = std::io::stdout().lock();
    let written = match args.json {
        true => letters
            .iter()
            .try_for_each(|l| writeln!(out, "{}", l.to_json())),
        false => write!(out, "{}", redrive::table(&letters)),
    };
    if written.is_ok() && letters.len() as i64 == args.limit {
        eprintln!("(at most --limit {} shown)", args.limit);
    }
    Ok(()) // a closed stdout (a pipe to `head`) is not a failure
}

async fn redrive(args: RedriveArgs) -> anyhow::Result<()> {
    let pool = db::connect(args.db.database_url.expose(), 1).await?;
    let command = "dead-letters redrive";
    check_schema(&pool, command, args.handler.kind).await?;
    let selection = args.selection();
    if args.dry_run {
        db::check_grants(&pool, command, &[db::Uses::ReadDeadLetters]).await?;
        let letters = redrive::preview(&pool, &selection).await?;
        print!("{}", redrive::table(&letters));
        println!(
            "dry run: {} dead letters would be re-driven; nothing changed",
            letters.len()
        );
        return Ok(());
    }
    let mut uses = vec![db::Uses::Redrive];
    if args.handler.kind == HandlerKind::Ledger {
        uses.push(db::Uses::Ledger);
    }
    db::check_grants(&pool, command, &uses).await?;
    let report = match sql_handler(&pool, command, &args.handler).await? {
        Some(handler) => redrive::redrive(&pool, &handler, &selection).await?,
        None => redrive::redrive(&pool, &Ledger, &selection).await?,
    };
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

/// The database's part of `run`'s start-up, within `--startup-timeout`: the first connection
/// (retried while the database cannot be reached), the schema, the role's grants for what this
/// run does, and the SQL handler's statement. Each failure is one line (exit 1).
async fn start_database(
    args: &RunArgs,
) -> anyhow::Result<(deadpool_postgres::Pool, Option<SqlHandler>)> {
    let within = args.startup_timeout;
    let deadline = tokio::time::Instant::now() + within;
    let options = db::ConnectOptions {
        statement_timeout: Some(args.pipeline.statement_timeout).filter(|t| !t.is_zero()),
    };
    let url = args.db.database_url.expose();
    let size = args.pipeline.pool_size.get();
    let pool = db::connect_within(url, size, options, within)
        .await
        .map_err(|e| match e.is_transient() {
            true => anyhow::anyhow!(
                "{} (still failing after --startup-timeout {within:?})",
                batch_inbox::one_line_error(&e)
            ),
            false => e.into(),
        })?;
    let checks = async {
        check_schema(&pool, "run", args.handler.kind).await?;
        let mut uses = vec![db::Uses::Inbox, db::Uses::PartitionUpkeep];
        if args.offsets_in_db {
            uses.push(db::Uses::OffsetsInDb);
        }
        if args.retention.is_some() {
            uses.push(db::Uses::Retention);
        }
        if args.handler.kind == HandlerKind::Ledger {
            uses.push(db::Uses::Ledger);
        }
        db::check_grants(&pool, "run", &uses).await?;
        // Before anything else starts: a statement that cannot run ends the process here.
        sql_handler(&pool, "run", &args.handler).await
    };
    let sql = match within.is_zero() {
        true => checks.await?,
        false => tokio::time::timeout_at(deadline, checks)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "the database did not answer the start-up checks (schema, grants) within \
                     --startup-timeout {within:?}"
                )
            })??,
    };
    Ok((pool, sql))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let (pool, sql) = start_database(&args).await?;
    // Before anything is consumed: refused credentials, a failed handshake, a missing ACL or no
    // broker within --startup-timeout end the process here, with the cause.
    args.processor()
        .kafka
        .probe(kafka_probe_time(&args))
        .await?;
    let maintenance = start_maintenance(&args, &pool).await?;
    let started = std::time::Instant::now();
    // The latency distributions are kept only for a stats file.
    let stats = Arc::new(match args.ops.stats_file {
        Some(_) => Stats::with_report(),
        None => Stats::default(),
    });
    let stats_file = args.ops.stats_file.clone().map(|path| {
        batch_inbox::stats_file::StatsFile::start(
            path,
            settings_of(&args),
            stats.clone(),
            args.ops.stats_interval,
        )
    });
    let result = match sql {
        Some(handler) => process(&args, &pool, stats.clone(), handler).await,
        None => process(&args, &pool, stats.clone(), Ledger).await,
    };
    if let Some(m) = maintenance {
        m.stop.cancel();
        if let Err(e) = m.task.await {
            tracing::warn!("retention task: {e}");
        }
    }
    if let Some(file) = stats_file {
        if let Err(e) = file.finish().await {
            tracing::warn!("cannot write the stats file: {e}");
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
    Ok(())
}

/// How long the broker probe may take: `--startup-timeout` (`0`: one attempt, bounded at 10 s).
/// The database's part has its own; the probe's lines name the timeout as given.
fn kafka_probe_time(args: &RunArgs) -> std::time::Duration {
    match args.startup_timeout.is_zero() {
        true => std::time::Duration::from_secs(10),
        false => args.startup_timeout,
    }
}

/// The settings recorded in the stats file.
fn settings_of(args: &RunArgs) -> RunSettings {
    let p = &args.pipeline;
    RunSettings {
        mode: p.mode.to_string(),
        batch_size: p.batch_size.get() as u64,
        linger_ms: p.linger_ms(),
        pool_size: p.pool_size.get() as u64,
        handler: args
            .handler
            .kind
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned()),
    }
}

/// Fails unless the tables `handler` needs are current: the core's, and with the ledger the
/// ledger's too. A schema behind names the `migrate` of this handler.
async fn check_schema(
    pool: &deadpool_postgres::Pool,
    command: &str,
    handler: HandlerKind,
) -> Result<(), DbError> {
    db::check_grants(pool, command, &[db::Uses::SchemaVersions]).await?;
    let checked = match handler {
        HandlerKind::Sql => db::check_schema(pool).await,
        HandlerKind::Ledger => match db::check_schema(pool).await {
            Ok(()) => ledger::check_schema(pool).await,
            behind => behind,
        },
    };
    checked.map_err(|e| e.with_migrate(migrate_command(handler)))
}

/// The `migrate` that creates and upgrades the tables of `handler`, quoted.
fn migrate_command(handler: HandlerKind) -> &'static str {
    match handler {
        HandlerKind::Ledger => "`batch-inbox migrate --handler ledger`",
        HandlerKind::Sql => "`batch-inbox migrate --handler sql`",
    }
}

/// The SQL handler of `--handler sql`, its statements prepared (`None`: the ledger).
async fn sql_handler(
    pool: &deadpool_postgres::Pool,
    command: &str,
    args: &HandlerArgs,
) -> anyhow::Result<Option<SqlHandler>> {
    if args.kind != HandlerKind::Sql {
        return Ok(None);
    }
    let mut by_topic = Vec::new();
    let mut fallback = None;
    for apply in &args.apply_sql {
        let statement = prepare_sql(pool, apply).await?;
        statement.check_grants(pool, command).await?;
        match &apply.topic {
            Some(topic) => by_topic.push((topic.clone(), statement)),
            None => fallback = Some(statement),
        }
    }
    Ok(Some(SqlHandler::routed(by_topic, fallback)))
}

/// Reads and prepares the statement of one `--apply-sql` (one line of error when it cannot run).
async fn prepare_sql(
    pool: &deadpool_postgres::Pool,
    apply: &ApplySql,
) -> anyhow::Result<SqlStatement> {
    let path = &apply.path;
    let statement = SqlStatement::from_file(pool, path)
        .await
        .map_err(|e| anyhow::anyhow!("--apply-sql {e}"))?;
    let result = match statement.returns_rejections() {
        true => "rows with message_id and reason are rejections",
        false => "its result rows are ignored",
    };
    let serves = match &apply.topic {
        Some(topic) => format!("topic {topic}"),
        None => "every topic without a statement of its own".to_owned(),
    };
    tracing::info!(
        "SQL handler: {} prepared for {serves}; {result}",
        path.display()
    );
    Ok(statement)
}

/// Runs the processor with `handler`, with the operations listener and the summary lines beside
/// it.
async fn process<H: Handler>(
    args: &RunArgs,
    pool: &deadpool_postgres::Pool,
    stats: Arc<Stats>,
    handler: H,
) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let stop_ops = stop.clone().drop_guard();
    let config = args.processor();
    // Before the listener starts: no scrape of an unsafe run reads 0.
    stats.mark_unsafe(&config.worker.unsafe_controls);
    if let Some(addr) = args.ops.metrics_addr {
        let url = args.db.database_url.expose();
        batch_inbox::exporter::start(addr, url, pool.clone(), stats.clone(), stop.clone()).await?;
    }
    let summary = cli::logging::summary_loop(stats.clone(), args.ops.log_interval, stop);
    let summary = tokio::spawn(summary);
    let result = batch_inbox::run_with_stats(
        config,
        pool.clone(),
        Arc::new(handler),
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

//! What each command but `run` does (`migrate`, `cleanup`, `dead-letters`, `positions set`), and
//! what `run` shares with them: the schema check of a handler, the SQL handler's statements, the
//! shutdown signal.
//!
//! Invariant: every command checks the schema and the role's grants it needs before it changes
//! anything; each failure is one line (exit 1).

use batch_inbox::{
    db, ledger, ledger::Ledger, redrive, retention, DbError, SqlHandler, SqlStatement, ValueFormat,
};

use super::dead_letters::{ListArgs, RedriveArgs};
use super::handler::{ApplySql, HandlerArgs, HandlerKind};
use super::positions::SetArgs;
use super::retention::{CleanupCommandArgs, MigrateArgs};

pub(crate) async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let pool = db::connect(args.db.database_url.expose(), 1).await?;
    let applied = db::migrate(&pool).await?;
    println!("core migrations applied: {applied:?}");
    if args.handler == HandlerKind::Ledger {
        let applied = ledger::migrate(&pool).await?;
        println!("ledger migrations applied: {applied:?}");
    }
    if args.partitioned {
        let today = batch_inbox::internals::days::day_of_millis(
            batch_inbox::internals::days::unix_millis(std::time::SystemTime::now()),
        );
        let mut client = pool.get().await?;
        match retention::convert(&mut client, today, args.partitions_ahead).await? {
            Some(c) => println!(
                "inbox partitioned by message_id: {} rows kept, {} daily partitions and a default",
                c.rows, c.partitions
            ),
            None => println!("inbox already partitioned"),
        }
    }
    Ok(())
}

pub(crate) async fn cleanup(args: CleanupCommandArgs) -> anyhow::Result<()> {
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

pub(crate) async fn list(args: ListArgs) -> anyhow::Result<()> {
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

pub(crate) async fn redrive(args: RedriveArgs) -> anyhow::Result<()> {
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

pub(crate) async fn set_positions(args: SetArgs) -> anyhow::Result<()> {
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

/// Fails unless the tables `handler` needs are current: the core's, and with the ledger the
/// ledger's too. A schema behind names the `migrate` of this handler.
pub(crate) async fn check_schema(
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
pub(crate) async fn sql_handler(
    pool: &deadpool_postgres::Pool,
    command: &str,
    args: &HandlerArgs,
) -> anyhow::Result<Option<SqlHandler>> {
    if args.kind != HandlerKind::Sql {
        return Ok(None);
    }
    let mut by_topic = Vec::new();
    let mut fallback = None;
    let (_, values) = args.reading();
    for apply in &args.apply_sql {
        let statement = prepare_sql(pool, apply).await?;
        if statement.reads_json() && values != ValueFormat::Json {
            anyhow::bail!(
                "--apply-sql {}: it reads the value as JSON (a `value /POINTER` field or `envelope = \
                 connect`), which needs --value-format json, not {values}",
                apply.path.display()
            );
        }
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

pub(crate) async fn shutdown_signal() {
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

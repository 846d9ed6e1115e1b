//! `run`: the library's service (`batch_inbox::Service`) with the ledger or the SQL handler,
//! its settings taken from the flags, and the run's totals printed at the end.
//!
//! Invariant: the flags map one to one onto `ServiceConfig`; nothing runs here that an embedding
//! service could not run through the library.

use std::sync::Arc;

use batch_inbox::stats_file::RunSettings;
use batch_inbox::{db, ledger::Ledger, Service, ServiceConfig, Stats};
use clap::ValueEnum;

use super::actions::{check_schema, shutdown_signal, sql_handler};
use super::commands::RunArgs;
use super::config_file::Source;
use super::handler::HandlerKind;

/// `run`: the library's service with the ledger or the SQL handler, and the run's totals.
pub(crate) async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = service_config(&args);
    let handler_args = &args.handler;
    let mut service = Service::start(
        config,
        |pool| async move { check_schema(&pool, "run", handler_args.kind).await },
        // Before anything else starts: a statement that cannot run ends the process here.
        |pool| async move { sql_handler(&pool, "run", handler_args).await },
    )
    .await?;
    let started = std::time::Instant::now();
    // The latency distributions are kept only for a stats file.
    let stats = Arc::new(match args.ops.stats_file {
        Some(_) => Stats::with_report(),
        None => Stats::default(),
    });
    match service.prepared.take() {
        Some(sql) => {
            service
                .run(Arc::new(sql), stats.clone(), shutdown_signal())
                .await?
        }
        None => {
            service
                .run(Arc::new(Ledger), stats.clone(), shutdown_signal())
                .await?
        }
    }
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

/// The service `run` runs: the flags as the library's settings.
fn service_config(args: &RunArgs) -> ServiceConfig {
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
    let mut config = ServiceConfig::new(args.processor(), args.db.database_url.clone());
    config.pool_size = args.pipeline.pool_size.get();
    config.statement_timeout = args.pipeline.statement_timeout;
    config.startup_timeout = args.startup_timeout;
    config.uses = uses;
    config.retention = args.retention;
    config.dedup_window = args.dedup_window;
    config.cleanup = args.cleanup.settings(args.retention.unwrap_or_default());
    config.cleanup_interval = std::time::Duration::from_secs(args.cleanup_interval_s);
    config.metrics_addr = args.ops.metrics_addr;
    config.log_interval = args.ops.log_interval;
    config.stats_file = args.ops.stats_file.clone();
    config.stats_interval = args.ops.stats_interval;
    config.run_settings = settings_of(args);
    config
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

/// `run --print-config`: every setting as a TOML line, with where it came from.
pub(crate) fn print_settings(settings: &[(String, String, Source)]) {
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

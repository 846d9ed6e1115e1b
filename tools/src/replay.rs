//! Database-only replay: the load test's batches, the product's statements and handler, driven
//! from memory with no Kafka.
//!
//! It generates the load test's input (`batch_inbox::generate`: duplicates, bad input, debits,
//! UUIDv7 ids), routes each record to its partition by its key like the producer, cuts each
//! partition into batches and decodes them before the clock starts; then one task per partition
//! applies its batches in order through `Inbox::apply_batch` (the ledger handler, offsets in the
//! database, a pool shared by all partitions), like the processor; `--mode per-message` applies
//! each record alone through `Inbox::apply_one`, the baseline. The database is created fresh
//! for each run, migrated, optionally changed by `--setup` SQL, and checkpointed; the run ends
//! with a check of the tables against the generator's model.
//!
//! It reports records/s, the PostgreSQL processes' CPU per record (from `/proc`: the server must
//! run on this machine), WAL bytes per record, statements per record (`pg_stat_statements`, when
//! the server preloads it) and where the transactions spent their time. Machines here are shared:
//! compare configurations run interleaved in the same session, not against old figures.
//!
//! `batch-inbox-bench replay --help`; the load test runs it as the database-only ceiling.

mod apply;
mod input;
mod report;
mod server;

use std::path::PathBuf;
use std::sync::Arc;

use crate::generate::{GeneratorSettings, KeyDistribution};
use crate::verify;
use anyhow::{bail, Context, Result};
use batch_inbox::internals::inbox::Inbox;
use batch_inbox::ledger::Ledger;
use batch_inbox::Mode;

use report::Report;
use server::Server;

/// `replay` flags: the load test's input replayed against PostgreSQL from memory, without Kafka.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Server URL without a database name.
    #[arg(
        long,
        env = "REPLAY_SERVER_URL",
        default_value = "postgres://postgres@127.0.0.1:5432"
    )]
    pub server_url: String,
    /// Database to (re)create for the run: DROPPED first.
    #[arg(long, default_value = "bi_replay")]
    pub database: String,
    /// Records to generate (duplicates and bad input included).
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Accounts (ids 1..=accounts).
    #[arg(long, default_value_t = 100_000)]
    pub accounts: u64,
    /// Share of records that re-send an earlier id.
    #[arg(long, default_value_t = 0.1)]
    pub duplicate_ratio: f64,
    /// Share of records that are bad input.
    #[arg(long, default_value_t = 0.01)]
    pub bad_ratio: f64,
    /// Share of new records that are debits.
    #[arg(long, default_value_t = 0.3)]
    pub debit_ratio: f64,
    /// UUID version of the ids: 4 or 7.
    #[arg(long, default_value_t = 7)]
    pub id_version: u8,
    /// How records spread over accounts.
    #[arg(long, value_enum, default_value_t = KeyDistribution::Uniform)]
    pub keys: KeyDistribution,
    /// Seed of the generator.
    #[arg(long, default_value_t = 2)]
    pub seed: u64,
    /// Partitions (records are routed by the CRC-32 of their key, like the producer).
    #[arg(long, default_value_t = 8)]
    pub partitions: i32,
    /// Records per batch (per partition).
    #[arg(long, default_value_t = 1000)]
    pub batch_size: usize,
    /// Transaction grouping: `batched` (the product) or `per-message` (the baseline: one
    /// transaction per record, `Inbox::apply_one`; the batch size is then 1).
    #[arg(long, value_parser = crate::product_args::named::<Mode>(), default_value_t = Mode::Batched)]
    pub mode: Mode,
    /// Database connections shared by the partitions.
    #[arg(long, default_value_t = 8)]
    pub pool_size: usize,
    /// Topic name stored with each inbox row.
    #[arg(long, default_value = "loadtest-1764478123")]
    pub topic: String,
    /// Consumer group whose offsets each batch stores in `consumer_offsets`.
    #[arg(long, default_value = "replay")]
    pub group: String,
    /// SQL files run after the migrations, before the clock starts (schema variants).
    #[arg(long)]
    pub setup: Vec<PathBuf>,
    /// Name of this configuration in the report.
    #[arg(long, default_value = "replay")]
    pub label: String,
    /// Appends the run's JSON report, one line, to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Prints the N statements with the most total time.
    #[arg(long, default_value_t = 0)]
    pub statements: usize,
    /// Runs even when the server's fsync or synchronous_commit is off (never for a reported
    /// figure: the product's offset commit relies on a durable COMMIT).
    #[arg(long)]
    pub allow_unsafe_durability: bool,
}

impl Args {
    fn generator(&self) -> GeneratorSettings {
        GeneratorSettings {
            messages: self.records,
            accounts: self.accounts,
            duplicate_ratio: self.duplicate_ratio,
            bad_ratio: self.bad_ratio,
            debit_ratio: self.debit_ratio,
            id_version: self.id_version,
            seed: self.seed,
            keys: self.keys,
        }
    }

    fn database_url(&self) -> String {
        format!(
            "{}/{}",
            self.server_url.trim_end_matches('/'),
            self.database
        )
    }
}

/// Runs one replay; fails when the database does not match the model.
pub async fn replay(args: Args) -> Result<()> {
    if !run(&args).await? {
        bail!("the database differs from the generator's model (see the report)");
    }
    Ok(())
}

/// One measured replay; `Ok(false)` when the database does not match the model.
async fn run(args: &Args) -> Result<bool> {
    if args.batch_size == 0 || args.partitions < 1 || args.pool_size == 0 {
        bail!("--batch-size, --partitions and --pool-size must be at least 1");
    }
    let server = Server::connect(&args.server_url).await?;
    let durability = durability(&server, args.allow_unsafe_durability).await?;
    let pool = prepare_database(&server, args).await?;
    let inbox = Arc::new(
        Inbox::new(pool.clone(), Arc::new(Ledger), "id").with_offsets_in_db(Some(&args.group)),
    );
    let generated = input::build(args.generator(), &args.topic, args.partitions);
    let expected = generated.expected;
    let size = match args.mode {
        Mode::PerMessage => 1,
        _ => args.batch_size,
    };
    let batches = input::batches(generated.partitions, size, |b| inbox.decode(b));

    server.checkpoint().await?;
    let statements_on = server.reset_statements().await;
    let before = server.counters().await?;
    let (own_before, machine_before) = (crate::cpu::own_cpu_s(), crate::cpu::MachineTicks::read());
    let replayed = apply::replay(inbox, &args.topic, batches, args.mode).await?;
    let own_cpu_s = crate::cpu::own_cpu_s() - own_before;
    let machine = crate::cpu::MachineTicks::read().busy_share_since(&machine_before);
    // The backends are idle and alive: their CPU is all in /proc now. Closed, they report their
    // WAL statistics.
    let pg_cpu_ticks = server.cpu_ticks();
    pool.close();
    server.wait_for_no_sessions(&args.database).await?;
    let delta = server.since(&before, pg_cpu_ticks).await?;
    let statements = match statements_on {
        true => Some(server.statements(&args.database).await?),
        false => None,
    };

    let check = batch_inbox::db::connect(&args.database_url(), 1).await?;
    let client = check.get().await?;
    let differences = verify::differences(&verify::observe(&**client).await?, &expected);
    let report = Report::new(args, durability, &replayed, delta, own_cpu_s, machine)
        .with_statements(statements)
        .with_differences(differences);
    report.print(args.statements);
    if let Some(path) = &args.report {
        report.append_to(path)?;
    }
    Ok(report.verified())
}

/// The server's `fsync` and `synchronous_commit`; an error when either is off, unless allowed.
async fn durability(server: &Server, allow_unsafe: bool) -> Result<(String, String)> {
    let fsync = server.setting("fsync").await?;
    let sync = server.setting("synchronous_commit").await?;
    if (fsync != "on" || sync != "on") && !allow_unsafe {
        bail!("fsync is {fsync} and synchronous_commit is {sync}: both must be on");
    }
    Ok((fsync, sync))
}

/// Recreates the database, migrates it, runs the setup files; returns a pool on it.
async fn prepare_database(server: &Server, args: &Args) -> Result<deadpool_postgres::Pool> {
    server.fresh_database(&args.database).await?;
    let pool = batch_inbox::db::connect(&args.database_url(), args.pool_size).await?;
    batch_inbox::db::migrate(&pool).await?;
    batch_inbox::ledger::migrate(&pool).await?;
    let client = pool.get().await?;
    for file in &args.setup {
        let sql = std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
        client
            .batch_execute(&sql)
            .await
            .with_context(|| format!("setup {}", file.display()))?;
    }
    drop(client);
    // Open every connection now, as a processor that has been running would have them.
    let warm = futures::future::try_join_all((0..args.pool_size).map(|_| pool.get())).await?;
    drop(warm);
    Ok(pool)
}

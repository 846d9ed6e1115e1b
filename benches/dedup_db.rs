//! Cost of the inbox's dedup statement alone (`INSERT … unnest … ON CONFLICT DO NOTHING
//! RETURNING`, copied from `src/pipeline/inbox.rs`) against a real PostgreSQL, by batch size.
//!
//! Why: the batched inbox replaces one statement and one COMMIT per message with one of each per
//! batch. This measures how the statement and its transaction scale with the batch size, for new
//! ids (the insert path, each transaction commits with the server's `synchronous_commit`, never
//! changed here) and for the same ids again (all duplicates, RETURNING empty), with time-ordered
//! UUIDv7 ids and, at batch size 1000, random UUIDv4 ids.
//!
//! It creates its own database `bi_bench_dedup` (dropped first), migrates it, and empties the
//! inbox before each series. Output: a table on stdout and `results/bench-dedup-db.json`.
//!
//! Environment: `BENCH_DATABASE_URL` is the server URL without a database name (default
//! `postgres://postgres@127.0.0.1:5432`); `BENCH_QUICK=1` does ~10x less work for a smoke run and
//! writes `results/bench-dedup-db.quick.json` instead, so it never overwrites real figures.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use batch_inbox::db;
use deadpool_postgres::Object;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio_postgres::{NoTls, Statement};
use uuid::Uuid;

const DB_NAME: &str = "bi_bench_dedup";
const DEFAULT_BASE_URL: &str = "postgres://postgres@127.0.0.1:5432";
const SIZES: [usize; 6] = [1, 10, 100, 500, 1_000, 5_000];
const V4_SIZES: [usize; 1] = [1_000];
const TOPIC: &str = "bench";
const PARTITION: i32 = 0;

/// The batched dedup statement the pipeline runs (one source: `batch_inbox::internals::sql`).
use batch_inbox::internals::sql::INSERT_IDS;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench dedup_db failed: cannot build the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench dedup_db failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How much work each series does.
struct Plan {
    quick: bool,
    target_ids: usize,
    min_batches: usize,
    warmup_batches: usize,
}

impl Plan {
    fn from_env() -> Self {
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
        let div = if quick { 10 } else { 1 };
        Self {
            quick,
            target_ids: 50_000 / div,
            min_batches: 20 / div,
            warmup_batches: 3,
        }
    }

    /// Enough batches for `target_ids` ids, and at least `min_batches`.
    fn batches(&self, size: usize) -> usize {
        self.target_ids.div_ceil(size).max(self.min_batches)
    }

    fn output_path(&self) -> String {
        let name = if self.quick {
            "bench-dedup-db.quick.json"
        } else {
            "bench-dedup-db.json"
        };
        format!("{}/results/{name}", env!("CARGO_MANIFEST_DIR"))
    }
}

#[derive(Debug, Clone, Copy)]
enum IdVersion {
    V4,
    V7,
}

impl IdVersion {
    fn new_id(self) -> Uuid {
        match self {
            IdVersion::V4 => Uuid::new_v4(),
            IdVersion::V7 => Uuid::now_v7(),
        }
    }

    fn label(self) -> &'static str {
        match self {
            IdVersion::V4 => "v4",
            IdVersion::V7 => "v7",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Every id is new: rows are inserted and the COMMIT writes WAL.
    New,
    /// Every id is already in the inbox: RETURNING is empty.
    Duplicate,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::New => "new",
            Phase::Duplicate => "duplicate",
        }
    }
}

/// The statement's parameters for one batch, built before timing starts.
struct Batch {
    ids: Vec<Uuid>,
    offsets: Vec<i64>,
}

fn make_batches(
    version: IdVersion,
    size: usize,
    count: usize,
    next_offset: &mut i64,
) -> Vec<Batch> {
    (0..count)
        .map(|_| {
            let ids: Vec<Uuid> = (0..size).map(|_| version.new_id()).collect();
            let offsets: Vec<i64> = (*next_offset..).take(size).collect();
            *next_offset += size as i64;
            Batch { ids, offsets }
        })
        .collect()
}

/// Facts about the machine and server the figures come from.
struct Facts {
    cores: usize,
    server_version: String,
    synchronous_commit: String,
    fsync: String,
    wal_sync_method: String,
    shared_buffers: String,
}

impl Facts {
    async fn read(client: &Object) -> Result<Self> {
        Ok(Self {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            server_version: show(client, "server_version").await?,
            synchronous_commit: show(client, "synchronous_commit").await?,
            fsync: show(client, "fsync").await?,
            wal_sync_method: show(client, "wal_sync_method").await?,
            shared_buffers: show(client, "shared_buffers").await?,
        })
    }

    fn print(&self) {
        println!(
            "machine: {} cores; PostgreSQL {}; synchronous_commit={} fsync={} wal_sync_method={} \
             shared_buffers={}",
            self.cores,
            self.server_version,
            self.synchronous_commit,
            self.fsync,
            self.wal_sync_method,
            self.shared_buffers
        );
        if self.synchronous_commit != "on" {
            eprintln!(
                "warning: synchronous_commit is {:?}, not \"on\": commit times are not durable \
                 commit times (this bench does not change it)",
                self.synchronous_commit
            );
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "nproc": self.cores,
            "server_version": self.server_version,
            "synchronous_commit": self.synchronous_commit,
            "fsync": self.fsync,
            "wal_sync_method": self.wal_sync_method,
            "shared_buffers": self.shared_buffers,
        })
    }
}

async fn show(client: &Object, setting: &str) -> Result<String> {
    let row = client
        .query_one(&format!("SHOW {setting}"), &[])
        .await
        .with_context(|| format!("SHOW {setting}"))?;
    Ok(row.get(0))
}

/// Latencies in microseconds.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn ms_at(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1_000.0
}

/// One measured series: one phase, one id version, one batch size.
struct Row {
    phase: Phase,
    version: IdVersion,
    size: usize,
    batches: usize,
    wall: Duration,
    stmt_total: Duration,
    stmt: Histogram<u64>,
    tx: Histogram<u64>,
}

impl Row {
    fn ids(&self) -> usize {
        self.size * self.batches
    }

    fn ids_per_s(&self, d: Duration) -> f64 {
        self.ids() as f64 / d.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn print_header() {
        println!(
            "{:<9} {:>4} {:>5} {:>7} {:>7} {:>7} {:>10} {:>11} {:>8} {:>8} {:>8} {:>8}",
            "phase",
            "uuid",
            "batch",
            "batches",
            "ids",
            "wall s",
            "ids/s(tx)",
            "ids/s(stmt)",
            "stmt p50",
            "stmt p99",
            "tx p50",
            "tx p99"
        );
    }

    fn print(&self) {
        println!(
            "{:<9} {:>4} {:>5} {:>7} {:>7} {:>7.2} {:>10.0} {:>11.0} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            self.phase.label(),
            self.version.label(),
            self.size,
            self.batches,
            self.ids(),
            self.wall.as_secs_f64(),
            self.ids_per_s(self.wall),
            self.ids_per_s(self.stmt_total),
            ms_at(&self.stmt, 0.5),
            ms_at(&self.stmt, 0.99),
            ms_at(&self.tx, 0.5),
            ms_at(&self.tx, 0.99),
        );
    }

    fn to_json(&self) -> Value {
        json!({
            "phase": self.phase.label(),
            "uuid_version": self.version.label(),
            "batch_size": self.size,
            "batches": self.batches,
            "ids": self.ids(),
            "wall_s": self.wall.as_secs_f64(),
            "ids_per_s": self.ids_per_s(self.wall),
            "ids_per_s_statement_only": self.ids_per_s(self.stmt_total),
            "statement_ms": {
                "p50": ms_at(&self.stmt, 0.5),
                "p99": ms_at(&self.stmt, 0.99),
                "max": self.stmt.max() as f64 / 1_000.0,
                "mean": self.stmt.mean() / 1_000.0,
            },
            "transaction_ms": {
                "p50": ms_at(&self.tx, 0.5),
                "p99": ms_at(&self.tx, 0.99),
                "max": self.tx.max() as f64 / 1_000.0,
                "mean": self.tx.mean() / 1_000.0,
            },
        })
    }
}

/// Runs each batch as BEGIN; dedup statement; COMMIT and checks RETURNING: every id back for new
/// ids, none for duplicates. Statement and whole-transaction times go to the histograms.
async fn measure(
    client: &mut Object,
    stmt: &Statement,
    batches: &[Batch],
    phase: Phase,
    version: IdVersion,
) -> Result<Row> {
    let size = batches.first().map_or(0, |b| b.ids.len());
    let (mut stmt_hist, mut tx_hist) = (histogram(), histogram());
    let mut stmt_total = Duration::ZERO;
    let wall = Instant::now();
    for batch in batches {
        let begin = Instant::now();
        let tx = client.transaction().await.context("BEGIN")?;
        let sent = Instant::now();
        let rows = tx
            .query(stmt, &[&batch.ids, &TOPIC, &PARTITION, &batch.offsets])
            .await
            .context("the dedup statement")?;
        let stmt_time = sent.elapsed();
        tx.commit().await.context("COMMIT")?;
        let tx_time = begin.elapsed();
        check_returned(phase, batch.ids.len(), rows.len())?;
        stmt_total += stmt_time;
        stmt_hist.saturating_record(micros(stmt_time));
        tx_hist.saturating_record(micros(tx_time));
    }
    Ok(Row {
        phase,
        version,
        size,
        batches: batches.len(),
        wall: wall.elapsed(),
        stmt_total,
        stmt: stmt_hist,
        tx: tx_hist,
    })
}

fn check_returned(phase: Phase, sent: usize, returned: usize) -> Result<()> {
    let want = match phase {
        Phase::New => sent,
        Phase::Duplicate => 0,
    };
    if returned != want {
        bail!(
            "{} batch of {sent} ids: RETURNING gave {returned} rows, expected {want}",
            phase.label()
        );
    }
    Ok(())
}

/// One batch size and id version: empty inbox, warm-up, all-new ids, then the same ids again.
async fn run_case(
    client: &mut Object,
    stmt: &Statement,
    plan: &Plan,
    version: IdVersion,
    size: usize,
) -> Result<[Row; 2]> {
    client
        .batch_execute("TRUNCATE inbox")
        .await
        .context("TRUNCATE inbox")?;
    let mut offset = 0;
    let warmup = make_batches(version, size, plan.warmup_batches, &mut offset);
    measure(client, stmt, &warmup, Phase::New, version).await?;
    let batches = make_batches(version, size, plan.batches(size), &mut offset);
    let new = measure(client, stmt, &batches, Phase::New, version).await?;
    new.print();
    let dup = measure(client, stmt, &batches, Phase::Duplicate, version).await?;
    dup.print();
    Ok([new, dup])
}

fn db_url(base: &str, database: &str) -> String {
    format!("{}/{database}", base.trim_end_matches('/'))
}

/// Drops and recreates the bench database through an admin connection to `postgres`.
async fn recreate_database(base: &str) -> Result<()> {
    let url = db_url(base, "postgres");
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    let connection = tokio::spawn(connection);
    for sql in [
        format!("DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)"),
        format!("CREATE DATABASE {DB_NAME}"),
    ] {
        client.batch_execute(&sql).await.context(sql)?;
    }
    drop(client);
    connection
        .await
        .context("admin connection task")?
        .context("admin connection")
}

fn write_json(plan: &Plan, facts: &Facts, rows: &[Row], elapsed: Duration) -> Result<String> {
    let path = plan.output_path();
    let generated = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let doc = json!({
        "bench": "dedup_db",
        "statement": INSERT_IDS,
        "database": DB_NAME,
        "quick": plan.quick,
        "target_ids_per_series": plan.target_ids,
        "min_batches_per_series": plan.min_batches,
        "warmup_batches_per_series": plan.warmup_batches,
        "generated_unix_s": generated,
        "elapsed_s": elapsed.as_secs_f64(),
        "machine": facts.to_json(),
        "series": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
    });
    let dir = format!("{}/results", env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {dir}"))?;
    let text = serde_json::to_string_pretty(&doc).context("serializing the results")?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {path}"))?;
    Ok(path)
}

fn cases() -> impl Iterator<Item = (IdVersion, usize)> {
    let v7 = SIZES.into_iter().map(|s| (IdVersion::V7, s));
    v7.chain(V4_SIZES.into_iter().map(|s| (IdVersion::V4, s)))
}

async fn run() -> Result<()> {
    let started = Instant::now();
    let plan = Plan::from_env();
    let base = std::env::var("BENCH_DATABASE_URL").unwrap_or_else(|_| DEFAULT_BASE_URL.to_owned());
    recreate_database(&base).await?;
    let url = db_url(&base, DB_NAME);
    let pool = db::connect(&url, 1)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    db::migrate(&pool)
        .await
        .context("migrating the bench database")?;
    let mut client = pool.get().await.context("taking a pooled connection")?;
    let facts = Facts::read(&client).await?;
    facts.print();
    let stmt = client
        .prepare(INSERT_IDS)
        .await
        .context("preparing the dedup statement")?;
    if plan.quick {
        println!("BENCH_QUICK=1: ~10x less work, figures are a smoke test only");
    }
    Row::print_header();
    let mut rows = Vec::new();
    for (version, size) in cases() {
        rows.extend(run_case(&mut client, &stmt, &plan, version, size).await?);
    }
    let path = write_json(&plan, &facts, &rows, started.elapsed())?;
    println!("wrote {path} ({:.1} s)", started.elapsed().as_secs_f64());
    Ok(())
}

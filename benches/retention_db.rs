//! Retention at scale, against a real PostgreSQL (run by `scripts/retention-bench.sh`, which
//! starts a private server so that WAL deltas are this bench's alone).
//!
//! 1. Dedup throughput with a large inbox: each of UUIDv4/UUIDv7 × plain/partitioned gets its own
//!    database pre-filled in SQL with `rows` rows spread over the last 8 days; then, in rounds that
//!    rotate over the four (so machine noise hits all alike), a CHECKPOINT and a chunk of batches
//!    of 1000 new ids through the library's inbox transaction: msgs/s and WAL bytes per message
//!    (`pg_current_wal_lsn()` deltas; the chunk pays the full-page writes a checkpoint causes).
//! 2. Batch latency while a cleanup runs (retention 7 days, so one eighth of the rows expire):
//!    batches of new UUIDv7 ids at a fixed rate, latency from each batch's intended start; first
//!    without cleanup, then while the library's cleanup runs (batched DELETE on the plain UUIDv7
//!    inbox, partition drop on the partitioned one), or, for contrast, one plain `DELETE … WHERE
//!    processed_at < …` of every expired row (the UUIDv4 plain inbox).
//!
//! Output: `results/retention/bench.json` and `summary.md` (`--quick`, or `BENCH_QUICK=1`: a
//! small smoke run written to `target/retention-bench-quick/` instead). Environment:
//! `BENCH_DATABASE_URL`, the server without a database name.

#[path = "retention_db/latency.rs"]
mod latency;
#[path = "retention_db/load.rs"]
mod load;
#[path = "retention_db/report.rs"]
mod report;

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use batch_inbox::db;
use batch_inbox::internals::days::{day_of_millis, unix_millis};
use batch_inbox::internals::retention::delete::NOT_V7;
use batch_inbox::internals::retention::partition::{self, DdlOutcome};
use batch_inbox::retention::{self, Layout};
use deadpool_postgres::Pool;
use load::Ids;
use serde_json::{json, Value};

const BATCH: usize = 1_000;
const DAYS: i64 = 8;

/// How much work the bench does.
pub struct Plan {
    pub quick: bool,
    pub rows: i64,
    pub rounds: usize,
    pub batches_per_chunk: usize,
    pub interval: Duration,
    pub idle: Duration,
}

impl Plan {
    fn from_env() -> Self {
        let quick = std::env::args().any(|a| a == "--quick")
            || std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
        let rows = std::env::var("BENCH_ROWS")
            .ok()
            .and_then(|v| v.parse().ok());
        Self {
            quick,
            rows: rows.unwrap_or(if quick { 200_000 } else { 10_000_000 }),
            rounds: if quick { 1 } else { 3 },
            batches_per_chunk: if quick { 10 } else { 100 },
            interval: Duration::from_millis(50),
            idle: Duration::from_secs(if quick { 2 } else { 15 }),
        }
    }

    fn out_dir(&self) -> String {
        let dir = if self.quick {
            "target/retention-bench-quick"
        } else {
            "results/retention"
        };
        format!("{}/{dir}", env!("CARGO_MANIFEST_DIR"))
    }
}

/// One inbox configuration.
#[derive(Clone, Copy)]
pub struct Config {
    pub ids: Ids,
    pub layout: Layout,
}

impl Config {
    pub fn label(&self) -> String {
        let layout = match self.layout {
            Layout::Plain => "plain",
            Layout::Partitioned => "partitioned",
        };
        format!("{}-{layout}", self.ids.label())
    }
}

const CONFIGS: [Config; 4] = [
    Config {
        ids: Ids::V4,
        layout: Layout::Plain,
    },
    Config {
        ids: Ids::V7,
        layout: Layout::Plain,
    },
    Config {
        ids: Ids::V4,
        layout: Layout::Partitioned,
    },
    Config {
        ids: Ids::V7,
        layout: Layout::Partitioned,
    },
];

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench retention_db failed: cannot build the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench retention_db failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn today() -> i64 {
    day_of_millis(unix_millis(SystemTime::now()))
}

async fn admin(base: &str, sql: &str) -> Result<()> {
    let pool = db::connect(&format!("{base}/postgres"), 1).await?;
    pool.get()
        .await?
        .batch_execute(sql)
        .await
        .context(sql.to_owned())
}

/// Creates, migrates and fills the database of `cfg`; returns its pool and facts about the fill.
async fn prepare(base: &str, cfg: Config, plan: &Plan) -> Result<(Pool, Value)> {
    let name = format!("ret_bench_{}", cfg.label().replace('-', "_"));
    admin(
        base,
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
    .await?;
    admin(base, &format!("CREATE DATABASE {name}")).await?;
    let pool = db::connect(&format!("{base}/{name}"), 3).await?;
    db::migrate(&pool).await?;
    let mut c = pool.get().await?;
    c.batch_execute(include_str!("../scripts/sql/uuid7_at.sql"))
        .await?;
    if cfg.layout == Layout::Partitioned {
        retention::convert(&mut c, today(), 3).await?;
        for day in today() - DAYS..today() {
            let created = partition::create_day(&mut c, day, Duration::from_secs(5)).await?;
            anyhow::ensure!(created == DdlOutcome::Done(0), "partition of day {day}");
        }
    }
    let started = Instant::now();
    let id = match cfg.ids {
        Ids::V4 => "gen_random_uuid()",
        Ids::V7 => "uuid7_at(ts)",
    };
    // Indexes are built after the fill (a sort), which is much faster than 10 M index inserts.
    c.batch_execute(&format!(
        "ALTER TABLE inbox DROP CONSTRAINT inbox_pkey; DROP INDEX inbox_processed_at;
         INSERT INTO inbox (message_id, topic, partition, \"offset\", processed_at)
         SELECT {id}, 'bench', g % 8, g, ts
         FROM generate_series(1, {rows}) g,
              LATERAL (SELECT now() - interval '{DAYS} days'
                              + (g::float8 / {rows}) * interval '{DAYS} days' AS ts) t;
         ALTER TABLE inbox ADD CONSTRAINT inbox_pkey PRIMARY KEY (message_id);
         CREATE INDEX inbox_processed_at ON inbox (processed_at) WHERE {NOT_V7};",
        rows = plan.rows
    ))
    .await
    .context("pre-filling the inbox")?;
    c.batch_execute("VACUUM (ANALYZE) inbox").await?;
    let fill_s = started.elapsed().as_secs_f64();
    let size: i64 = c
        .query_one(
            "SELECT coalesce(sum(pg_total_relation_size(relid))::bigint,
                             pg_total_relation_size('inbox'))
             FROM pg_partition_tree('inbox')",
            &[],
        )
        .await?
        .get(0);
    println!(
        "{}: {} rows in {fill_s:.0} s, {} MB",
        cfg.label(),
        plan.rows,
        size >> 20
    );
    Ok((
        pool,
        json!({ "rows": plan.rows, "fill_s": fill_s, "bytes": size }),
    ))
}

/// Throughput and WAL of new ids, in rounds over every configuration.
async fn throughput(pools: &[Pool], plan: &Plan) -> Result<Vec<Value>> {
    let mut totals = vec![(0u64, Duration::ZERO, 0i64, load::histogram()); pools.len()];
    let mut offset = 0;
    for round in 0..plan.rounds {
        for (i, (pool, cfg)) in pools.iter().zip(CONFIGS).enumerate() {
            let batches = load::batches(cfg.ids, BATCH, plan.batches_per_chunk, &mut offset);
            let c = pool.get().await?;
            c.batch_execute("CHECKPOINT").await?;
            let wal = load::wal_lsn(&c).await?;
            let inbox = load::inbox(pool);
            for batch in &batches {
                let took = load::apply(&inbox, batch).await?;
                let t = &mut totals[i];
                t.0 += BATCH as u64;
                t.1 += took;
                t.3.saturating_record(took.as_micros() as u64);
            }
            totals[i].2 += load::wal_lsn(&c).await? - wal;
            println!("round {round} {}: done", cfg.label());
        }
    }
    Ok(totals
        .iter()
        .zip(CONFIGS)
        .map(|((msgs, busy, wal, hist), cfg)| {
            json!({
                "config": cfg.label(),
                "msgs": msgs,
                "msgs_per_s": *msgs as f64 / busy.as_secs_f64(),
                "wal_bytes_per_msg": *wal as f64 / *msgs as f64,
                "batch_latency": load::percentiles(hist),
            })
        })
        .collect())
}

/// How long preparing one more day takes on each partitioned inbox: ATTACH scans the default
/// partition, which holds every UUIDv4 id.
async fn attach_times(pools: &[Pool]) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for (pool, cfg) in pools.iter().zip(CONFIGS) {
        if cfg.layout != Layout::Partitioned {
            continue;
        }
        let mut c = pool.get().await?;
        let default_rows: i64 = c
            .query_one("SELECT count(*) FROM inbox_default", &[])
            .await?
            .get(0);
        let started = Instant::now();
        let outcome = partition::create_day(&mut c, today() + 10, Duration::from_secs(5)).await?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{}: one more day prepared in {secs:.3} s ({outcome:?})",
            cfg.label()
        );
        out.push(
            json!({ "config": cfg.label(), "default_rows": default_rows, "create_day_s": secs }),
        );
    }
    Ok(out)
}

async fn run() -> Result<()> {
    let plan = Plan::from_env();
    let base = std::env::var("BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    let base = base.trim_end_matches('/').to_owned();
    let started = Instant::now();
    let mut pools = Vec::new();
    let mut fills = Vec::new();
    for cfg in CONFIGS {
        let (pool, fill) = prepare(&base, cfg, &plan).await?;
        pools.push(pool);
        fills.push(json!({ "config": cfg.label(), "fill": fill }));
    }
    let machine = report::machine(&pools[0]).await?;
    let throughput = throughput(&pools, &plan).await?;
    let attach = attach_times(&pools).await?;
    let mut latency = Vec::new();
    for (pool, cfg) in pools.iter().zip(CONFIGS) {
        let how = match (cfg.ids, cfg.layout) {
            (Ids::V7, _) => latency::Cleanup::Library,
            (Ids::V4, Layout::Plain) => latency::Cleanup::OneDelete,
            (Ids::V4, Layout::Partitioned) => continue,
        };
        latency.push(latency::during_cleanup(pool, &cfg.label(), how, &plan).await?);
    }
    drop(pools);
    for cfg in CONFIGS {
        let name = format!("ret_bench_{}", cfg.label().replace('-', "_"));
        admin(
            &base,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        )
        .await?;
    }
    let doc = json!({
        "bench": "retention_db",
        "quick": plan.quick,
        "rows_prefilled": plan.rows,
        "days_prefilled": DAYS,
        "retention_days": 7,
        "batch_size": BATCH,
        "rounds": plan.rounds,
        "batches_per_chunk": plan.batches_per_chunk,
        "elapsed_s": started.elapsed().as_secs_f64(),
        "machine": machine,
        "fill": fills,
        "throughput": throughput,
        "attach_with_full_default": attach,
        "latency_during_cleanup": latency,
    });
    let dir = plan.out_dir();
    for path in report::write(&dir, &doc)? {
        println!("wrote {path}");
    }
    Ok(())
}

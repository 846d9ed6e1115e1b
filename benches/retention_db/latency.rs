//! Batch latency of the processor while a cleanup runs, against the same inbox without one.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use batch_inbox::retention::{self, RetentionSettings};
use deadpool_postgres::Pool;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::load::{self, Ids};
use crate::Plan;

const BATCH: usize = 1_000;
const RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// Which cleanup runs beside the batches.
#[derive(Debug, Clone, Copy)]
pub enum Cleanup {
    /// `retention::cleanup`: batched DELETE, or partition drop.
    Library,
    /// One DELETE of every expired row: what the library avoids.
    OneDelete,
}

/// Runs batches of new UUIDv7 ids every `plan.interval` for at least `min` and until `done` is
/// cancelled; latency from each batch's intended start.
async fn paced_load(
    pool: &Pool,
    plan: &Plan,
    min: Duration,
    done: &CancellationToken,
) -> Result<(Histogram<u64>, i64)> {
    let c = pool.get().await?;
    c.batch_execute("CHECKPOINT").await?;
    let wal = load::wal_lsn(&c).await?;
    let inbox = load::inbox(pool);
    let mut hist = load::histogram();
    let started = tokio::time::Instant::now();
    let mut offset = 1_000_000_000;
    for i in 0u32.. {
        if started.elapsed() >= min && done.is_cancelled() {
            break;
        }
        let batch = load::batches(Ids::V7, BATCH, 1, &mut offset).remove(0);
        let intended = started + plan.interval * i;
        tokio::time::sleep_until(intended).await;
        load::apply(&inbox, &batch).await?;
        hist.saturating_record(intended.elapsed().as_micros() as u64);
    }
    Ok((hist, load::wal_lsn(&c).await? - wal))
}

async fn library_cleanup(pool: Pool) -> Result<Value> {
    let mut settings = RetentionSettings::default();
    settings.retention = RETENTION;
    let stop = CancellationToken::new();
    let r = retention::cleanup(&pool, &settings, SystemTime::now(), &stop).await?;
    Ok(json!({
        "how": if r.partitions_dropped.is_empty() { "batched DELETE" } else { "partition drop" },
        "rows_deleted": r.rows_deleted,
        "delete_statements": r.delete_statements,
        "longest_statement_ms": r.longest_statement.as_secs_f64() * 1e3,
        "partitions_dropped": r.partitions_dropped,
        "rows_in_dropped_partitions_estimate": r.rows_dropped_estimate,
        "elapsed_s": r.elapsed.as_secs_f64(),
        "report": r.to_string(),
    }))
}

async fn one_delete(pool: Pool) -> Result<Value> {
    let c = pool.get().await?;
    let started = Instant::now();
    let rows = c
        .execute(
            "DELETE FROM inbox WHERE processed_at < now() - interval '7 days'",
            &[],
        )
        .await
        .context("one DELETE")?;
    let secs = started.elapsed().as_secs_f64();
    Ok(json!({
        "how": "one DELETE",
        "rows_deleted": rows,
        "delete_statements": 1,
        "longest_statement_ms": secs * 1e3,
        "partitions_dropped": [],
        "elapsed_s": secs,
        "report": format!("removed {rows} rows in 1 statement in {secs:.2} s"),
    }))
}

/// Latency without, then during, a cleanup of `how`; WAL of both phases.
pub async fn during_cleanup(pool: &Pool, label: &str, how: Cleanup, plan: &Plan) -> Result<Value> {
    let no_wait = CancellationToken::new();
    no_wait.cancel();
    let (idle, idle_wal) = paced_load(pool, plan, plan.idle, &no_wait).await?;
    let done = CancellationToken::new();
    let cleanup = {
        let (pool, done) = (pool.clone(), done.clone());
        tokio::spawn(async move {
            let report = match how {
                Cleanup::Library => library_cleanup(pool).await,
                Cleanup::OneDelete => one_delete(pool).await,
            };
            done.cancel();
            report
        })
    };
    let (during, during_wal) = paced_load(pool, plan, plan.idle, &done).await?;
    let mut report = cleanup.await.context("cleanup task")??;
    println!("{label} cleanup: {}", report["report"]);
    // The cleanup's own WAL: the phase's, less what as many batches wrote without a cleanup.
    let per_batch = idle_wal as f64 / idle.len().max(1) as f64;
    report["wal_bytes_estimate"] = json!(during_wal as f64 - per_batch * during.len() as f64);
    Ok(json!({
        "config": label,
        "batch_size": BATCH,
        "batch_interval_ms": plan.interval.as_millis() as u64,
        "without_cleanup": load::percentiles(&idle),
        "during_cleanup": load::percentiles(&during),
        "wal_bytes_without_cleanup": idle_wal,
        "wal_bytes_during_cleanup": during_wal,
        "cleanup": report,
    }))
}

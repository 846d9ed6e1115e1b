//! Load-test tooling that talks to the database: statement counts and the COPY ceiling.

use std::time::Instant;

use deadpool_postgres::Pool;
use futures::future::try_join_all;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;
use uuid::Uuid;

use batch_inbox::DbError;

/// Statements executed so far in the current database, from pg_stat_statements; `None` when the
/// extension is not loaded (it needs `shared_preload_libraries`).
pub async fn statement_count(pool: &Pool) -> Option<i64> {
    let client = pool.get().await.ok()?;
    let _ = client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
    client
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .ok()
        .map(|r| r.get(0))
}

/// Copies every row of `inbox` into a fresh, empty table of the same shape and primary key with
/// binary COPY, over `streams` connections in parallel (partitions spread over them), each in one
/// transaction. Returns rows copied and seconds taken: the database's limit for this work.
pub async fn copy_ceiling(pool: &Pool, streams: usize) -> Result<(u64, f64), DbError> {
    let client = pool.get().await?;
    client
        .batch_execute(
            "DROP TABLE IF EXISTS inbox_ceiling;
             CREATE TABLE inbox_ceiling (LIKE inbox INCLUDING ALL)",
        )
        .await?;
    let rows = client
        .query(
            "SELECT message_id, topic, partition, \"offset\" FROM inbox ORDER BY partition, \"offset\"",
            &[],
        )
        .await?;
    drop(client);
    let streams = streams.max(1);
    let mut shares: Vec<Vec<(Uuid, String, i32, i64)>> = vec![Vec::new(); streams];
    for r in &rows {
        let partition: i32 = r.get(2);
        shares[partition.rem_euclid(streams as i32) as usize].push((
            r.get(0),
            r.get(1),
            partition,
            r.get(3),
        ));
    }
    let started = Instant::now();
    try_join_all(shares.into_iter().map(|share| copy_share(pool, share))).await?;
    Ok((rows.len() as u64, started.elapsed().as_secs_f64()))
}

async fn copy_share(pool: &Pool, rows: Vec<(Uuid, String, i32, i64)>) -> Result<(), DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let sink = tx
        .copy_in("COPY inbox_ceiling (message_id, topic, partition, \"offset\") FROM STDIN BINARY")
        .await?;
    let writer = BinaryCopyInWriter::new(sink, &[Type::UUID, Type::TEXT, Type::INT4, Type::INT8]);
    let mut writer = std::pin::pin!(writer);
    for (id, topic, partition, offset) in &rows {
        writer
            .as_mut()
            .write(&[id, topic, partition, offset])
            .await?;
    }
    writer.finish().await?;
    tx.commit().await?;
    Ok(())
}

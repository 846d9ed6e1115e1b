//! Helpers for the retention tests: rows with chosen times, UUIDv7 ids of chosen days, counts.
//! Used as `common::retention`.
#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use batch_inbox::retention::RetentionSettings;
use deadpool_postgres::Pool;
use uuid::Uuid;

pub const DAY: Duration = Duration::from_secs(86_400);

/// A UUIDv7 created at `t`.
pub fn v7_at(t: SystemTime) -> Uuid {
    let d = t.duration_since(UNIX_EPOCH).unwrap();
    Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        d.as_secs(),
        d.subsec_nanos(),
    ))
}

/// Settings with a small batch and short pauses, so that batching shows in the counts.
pub fn settings(retention: Duration, batch_rows: i64) -> RetentionSettings {
    let mut settings = RetentionSettings::default();
    settings.retention = retention;
    settings.batch_rows = batch_rows;
    settings.pause = Duration::from_millis(1);
    settings.lock_timeout = Duration::from_millis(100);
    settings.partitions_ahead = 3;
    settings
}

/// Installs `uuid7_at(timestamptz)` (the SQL the bench script uses too).
pub async fn install_uuid7(pool: &Pool) {
    let c = pool.get().await.unwrap();
    c.batch_execute(include_str!("../../../scripts/sql/uuid7_at.sql"))
        .await
        .unwrap();
}

/// Inserts `n` rows processed `age` before now, with UUIDv4 (`v7 = false`) or UUIDv7 ids created
/// at the same time as they were processed.
pub async fn insert_rows(pool: &Pool, n: i64, age: Duration, v7: bool) {
    let c = pool.get().await.unwrap();
    let id = if v7 {
        "uuid7_at(t)"
    } else {
        "gen_random_uuid()"
    };
    let age_s = age.as_secs_f64();
    c.execute(
        &format!(
            "INSERT INTO inbox (message_id, topic, partition, \"offset\", processed_at)
             SELECT {id}, 'seed', 0, g, t
             FROM generate_series(1, $1::bigint) g,
                  LATERAL (SELECT now() - make_interval(secs => $2) AS t) tt"
        ),
        &[&n, &age_s],
    )
    .await
    .unwrap();
}

/// Rows of `table` matching `filter` (SQL).
pub async fn count(pool: &Pool, table: &str, filter: &str) -> i64 {
    let c = pool.get().await.unwrap();
    c.query_one(&format!("SELECT count(*) FROM {table} WHERE {filter}"), &[])
        .await
        .unwrap()
        .get(0)
}

/// A fingerprint of every inbox row (count and a hash of all columns in id order).
pub async fn fingerprint(pool: &Pool) -> (i64, String) {
    let c = pool.get().await.unwrap();
    let row = c
        .query_one(
            "SELECT count(*), coalesce(md5(string_agg(
                 concat_ws('|', message_id, topic, partition, \"offset\", processed_at),
                 ',' ORDER BY message_id)), '')
             FROM inbox",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

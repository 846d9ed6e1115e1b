//! The SQL handler gets a re-driven message as it first would have: the same id, key,
//! partition, offset and Kafka timestamp in `$1`.

use super::{counts, exec, redrive_bin, report};
use crate::common::raw_producer::RawRecord;
use crate::common::uuid;
use crate::sql_handler::{apply, record, sql_scenario};
use batch_inbox::redrive::RedriveReport;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_handler_gets_a_re_driven_message_as_it_first_would_have() {
    let dir = std::env::temp_dir().join(format!("bi-redrive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sql = dir.join("events.sql");
    std::fs::write(
        &sql,
        "INSERT INTO events SELECT m.id, (m.value->>'n')::int, m.partition, m.\"offset\",
             m.timestamp_ms, m.key
         FROM jsonb_to_recordset($1) AS m(id uuid, key text, partition int, \"offset\" bigint,
             timestamp_ms bigint, value jsonb)",
    )
    .unwrap();
    const TS: i64 = 1_748_736_000_000;
    let records: Vec<RawRecord> = (1..=6u32)
        .map(|n| RawRecord {
            timestamp_ms: Some(TS + i64::from(n)),
            ..record(
                (n % 2) as i32,
                n,
                Some(format!("k{n}").as_bytes()),
                &format!(r#"{{"n": {n}}}"#),
            )
        })
        .collect();
    let world = sql_scenario("redrive_sql", "redrive-sql")
        .core_tables(
            "CREATE TABLE events (message_id uuid PRIMARY KEY, n int NOT NULL CHECK (n % 3 <> 0),
                 partition int, \"offset\" bigint, timestamp_ms bigint, key text)",
        )
        .partitions(2)
        .records(records)
        .build()
        .await;
    let (url, pool) = world.db();
    let run = apply(&world, &url, "g", &sql, &[]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let parked = "SELECT count(*) FROM dead_letters WHERE reason = 'handler_error'";
    assert_eq!(
        crate::sql_handler::count(&pool, parked).await,
        2,
        "n = 3 and 6 refused"
    );
    exec(&pool, "ALTER TABLE events DROP CONSTRAINT events_n_check").await;
    let flags = ["--handler", "sql", "--apply-sql", sql.to_str().unwrap()];
    assert_eq!(
        report(&redrive_bin(&url, &flags, &[]).await),
        counts(2, 0, 0)
    );
    assert_eq!(
        report(&redrive_bin(&url, &flags, &[]).await),
        RedriveReport::default()
    );
    let c = pool.get().await.unwrap();
    let rows = c
        .query("SELECT message_id::text, n, partition, \"offset\", timestamp_ms, key FROM events ORDER BY n", &[])
        .await
        .unwrap();
    let events: Vec<(String, i32, i32, i64, i64, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    let expected: Vec<_> = (1..=6)
        .map(|n: i32| {
            let (p, o) = (n % 2, (n as i64 - 1) / 2);
            (uuid(n as u32), n, p, o, TS + n as i64, format!("k{n}"))
        })
        .collect();
    assert_eq!(events, expected);
    assert_eq!(
        crate::sql_handler::count(&pool, "SELECT count(*) FROM inbox").await,
        6
    );
    let _ = std::fs::remove_dir_all(&dir);
}

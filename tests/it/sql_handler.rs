//! `run --handler sql --apply-sql FILE`: the examples of examples/sql/ through the binary against a
//! broker (Apache Kafka, `KAFKA_BROKERS`), each on a fresh database. Duplicates inside and across
//! batches are applied once, rejections and failing messages are dead-lettered exactly, and a
//! statement that cannot run ends the process before anything is consumed. Crashes between
//! COMMIT and the offset store: module `crash` (failpoints builds).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::broker::Broker;
use crate::common::child::{Finished, Running};
use crate::common::raw_producer::{RawProducer, RawRecord};
use crate::common::scenario::{Scenario, World};
use crate::common::{fresh_core_db, uuid};
use deadpool_postgres::Pool;

#[cfg(feature = "failpoints")]
mod crash;
mod real_topics;
mod rejections;
mod startup;
mod two_topics;
mod typed;

/// 2025-06-01, 2026-03-01 and 2001-09-09 (no partition of its own), in Unix milliseconds.
const TS_2025: i64 = 1_748_736_000_000;
const TS_2026: i64 = 1_772_323_200_000;
const TS_2001: i64 = 1_000_000_000_000;

pub(crate) fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/sql")
        .join(name)
}

/// The tables of example DDL file `name`.
pub(crate) fn ddl(name: &str) -> String {
    std::fs::read_to_string(example(name)).unwrap()
}

/// A scenario of the SQL handler on the suite's broker: database `db` with the core's tables
/// alone (a handler's are added with [`Scenario::core_tables`]), topic `topic`; the binary runs
/// as `--handler sql` with no summary lines, warnings logged.
pub(crate) fn sql_scenario(db: &str, topic: &str) -> Scenario {
    Scenario::new(db).topic(topic).core_tables("").args(&[
        "--handler",
        "sql",
        "--log-interval",
        "0",
    ])
}

/// `--apply-sql sql` over the world's topic to its end, on the database at `url` as group
/// `group` (made the topic's own), with a 200 ms linger and `extra` flags; waits at most 120 s.
pub(crate) async fn apply(
    world: &World,
    url: &str,
    group: &str,
    sql: &Path,
    extra: &[&str],
) -> Finished {
    let mut flags = vec!["--apply-sql", sql.to_str().unwrap()];
    flags.extend(["--batch-linger-ms", "200"]);
    flags.extend(extra);
    world.run_binary_on(url, group, &flags).await
}

/// The runs of a test in both modes: the scenario's database for the batched mode, a fresh one
/// `per_message_db` for the per-message mode.
pub(crate) async fn both_modes(
    world: &World,
    per_message_db: &str,
) -> [((String, Pool), &'static str); 2] {
    let per_message = world.database(per_message_db).await;
    [(world.db(), "batched"), (per_message, "per-message")]
}

/// A fresh database of the SQL handler (the core's tables, no ledger) with the tables of
/// example DDL file `ddl`.
pub(crate) async fn db_with(name: &str, ddl: &str) -> (String, Pool) {
    let (url, pool) = fresh_core_db(name).await;
    let ddl = std::fs::read_to_string(example(ddl)).unwrap();
    pool.get().await.unwrap().batch_execute(&ddl).await.unwrap();
    (url, pool)
}

/// A record of `partition` with id header `id` (`uuid(n)`), a key and a value.
pub(crate) fn record(partition: i32, id: u32, key: Option<&[u8]>, value: &str) -> RawRecord {
    RawRecord {
        partition,
        key: key.map(<[u8]>::to_vec),
        value: Some(value.as_bytes().to_vec()),
        headers: vec![(b"id".to_vec(), Some(uuid(id).into_bytes()))],
        timestamp_ms: None,
    }
}

/// Creates `topic` with `partitions` and produces `records`, delivered.
pub(crate) async fn produce(broker: &Broker, topic: &str, partitions: i32, records: &[RawRecord]) {
    batch_inbox_tools::produce::ensure_topic(&broker.addr, topic, partitions)
        .await
        .unwrap();
    let mut producer = RawProducer::new(&broker.addr, topic);
    for r in records {
        producer.send(r);
    }
    producer.flush();
}

/// `batch-inbox run --handler sql --apply-sql sql` over `topic` for `group` (made the topic's
/// own, [`Broker::group`]) with `extra` flags, no summary lines, warnings logged; runs until
/// stopped.
pub(crate) fn spawn_sql(
    url: &str,
    broker: &Broker,
    topic: &str,
    group: &str,
    sql: &Path,
    extra: &[&str],
) -> Running {
    let sql = sql.to_str().unwrap();
    let group = Broker::group(topic, group);
    let mut args = vec!["run", "--database-url", url, "--brokers", &broker.addr];
    args.extend(["--topic", topic, "--group", &group]);
    args.extend([
        "--handler",
        "sql",
        "--apply-sql",
        sql,
        "--log-interval",
        "0",
    ]);
    args.extend(extra);
    Running::spawn(&args, &[("RUST_LOG", "warn")])
}

/// The counters of a successful run's summary line: records, new, duplicates, invalid, rejected,
/// poisoned.
pub(crate) fn summary(run: &Finished) -> [u64; 6] {
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let number_after = |word: &str| -> u64 {
        let words: Vec<&str> = run.stdout.split_whitespace().collect();
        let i = words.iter().position(|w| *w == word).expect(word);
        let n = words[i + 1].trim_matches(|c: char| !c.is_ascii_digit());
        n.parse().unwrap()
    };
    [
        "records",
        "new",
        "duplicates",
        "(invalid",
        "rejected",
        "poisoned",
    ]
    .map(number_after)
}

/// `(partition, offset, message_id, reason, detail)` of every dead letter.
pub(crate) type Letter = (i32, i64, Option<String>, String, String);

pub(crate) async fn dead_letters(pool: &Pool) -> Vec<Letter> {
    let c = pool.get().await.unwrap();
    let rows = c
        .query(
            "SELECT partition, \"offset\", message_id, reason, coalesce(detail, '')
             FROM dead_letters ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

pub(crate) async fn count(pool: &Pool, sql: &str) -> i64 {
    let c = pool.get().await.unwrap();
    c.query_one(sql, &[]).await.unwrap().get(0)
}

/// `(customer_id, doc as text, source_offset)` of every customer.
pub(crate) async fn customers(pool: &Pool) -> Vec<(String, String, i64)> {
    let c = pool.get().await.unwrap();
    let rows = c
        .query(
            "SELECT customer_id, doc::text, source_offset FROM customers ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn letter(offset: i64, id: u32, reason: &str, detail: &str) -> Letter {
    (
        0,
        offset,
        Some(uuid(id)),
        reason.to_owned(),
        detail.to_owned(),
    )
}

/// Customers: keys with several versions, duplicates next to each other (one batch) and far
/// apart (another batch), two versions of a key in one batch, a record without a key and one with
/// a key that is not UTF-8 (rejected, `missing_key`), a value that is not JSON.
fn customer_records() -> Vec<RawRecord> {
    let c = |id, key: &str, value: &str| record(0, id, Some(key.as_bytes()), value);
    vec![
        c(1, "c1", r#"{"name": "Ann", "v": 1}"#),    // 0
        c(1, "c1", r#"{"name": "Ann", "v": 1}"#),    // 1: copy in the same batch
        c(2, "c2", r#"{"v": 1}"#),                   // 2
        c(3, "c1", r#"{"v": 2}"#),                   // 3
        record(0, 4, None, r#"{"v": 0}"#),           // 4: no key
        c(2, "c2", r#"{"v": 1}"#),                   // 5: copy in a later batch
        c(5, "c2", r#"{"v": 2}"#),                   // 6
        c(6, "c1", r#"{"v": 3}"#),                   // 7
        c(3, "c1", r#"{"v": 2}"#),                   // 8: copy in a later batch
        c(7, "c3", r#"{"v": 1}"#),                   // 9
        c(8, "c2", r#"{"v": 3}"#),                   // 10
        c(9, "c2", r#"{"v": 4}"#),                   // 11: same key, same batch
        record(0, 10, Some(b"\xff"), r#"{"v": 9}"#), // 12: key not UTF-8
        c(11, "c4", "{"),                            // 13: not JSON
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customers_keep_the_latest_state_per_key_applied_once() {
    let world = sql_scenario("sql_customers", "sql-customers")
        .core_tables(&ddl("customers.ddl.sql"))
        .records(customer_records())
        .build()
        .await;
    let expected_customers = vec![
        ("c1".to_owned(), r#"{"v": 3}"#.to_owned(), 7),
        ("c2".to_owned(), r#"{"v": 4}"#.to_owned(), 11),
        ("c3".to_owned(), r#"{"v": 1}"#.to_owned(), 9),
    ];
    let no_key = "a customer record needs a key";
    let sql = example("customers.sql");
    for ((url, pool), mode) in both_modes(&world, "sql_customers_pm").await {
        let flags = ["--mode", mode, "--batch-size", "4"];
        // A group per mode: both read the whole topic.
        let run = apply(&world, &url, mode, &sql, &flags).await;
        // records, new, duplicates, invalid, rejected, poisoned
        assert_eq!(summary(&run), [14, 10, 3, 1, 2, 0], "{mode}");
        assert_eq!(customers(&pool).await, expected_customers, "{mode}");
        assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 10);
        let letters = dead_letters(&pool).await;
        assert_eq!(letters.len(), 3, "{mode}: {letters:?}");
        assert_eq!(letters[0], letter(4, 4, "missing_key", no_key));
        assert_eq!(letters[1], letter(12, 10, "missing_key", no_key));
        assert_eq!(letters[2].1, 13);
        assert_eq!(letters[2].3, "invalid_payload");

        // The inbox expires; a replay from the start (another group) finds every message new,
        // and no older version overwrites a newer one.
        let c = pool.get().await.unwrap();
        c.batch_execute("DELETE FROM inbox").await.unwrap();
        let replay = format!("{mode}-replay");
        let run = apply(&world, &url, &replay, &sql, &flags).await;
        assert_eq!(summary(&run), [14, 10, 3, 1, 2, 0], "{mode}: replay");
        assert_eq!(customers(&pool).await, expected_customers, "{mode}: replay");
        assert_eq!(dead_letters(&pool).await, letters, "one row per position");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_views_append_once_into_their_time_partitions() {
    let view = |partition, id, path: &str, ts| RawRecord {
        timestamp_ms: Some(ts),
        ..record(
            partition,
            id,
            Some(b"u"),
            &format!(r#"{{"path": "{path}"}}"#),
        )
    };
    let records = [
        view(0, 1, "/a", TS_2025),   // p0 o0
        view(0, 1, "/a", TS_2025),   // p0 o1: copy
        view(0, 2, "/b", TS_2026),   // p0 o2
        view(0, 3, "nope", TS_2026), // p0 o3: fails the CHECK
        view(0, 4, "/c", TS_2001),   // p0 o4: default partition
        view(0, 2, "/b", TS_2026),   // p0 o5: copy
        view(0, 5, "/a", TS_2026),   // p0 o6
        view(1, 6, "/a", TS_2025),   // p1 o0
        view(1, 7, "/d", TS_2026),   // p1 o1
        view(1, 6, "/a", TS_2025),   // p1 o2: copy
        view(1, 8, "/e", TS_2026),   // p1 o3
    ];
    let world = sql_scenario("sql_page_views", "sql-page-views")
        .core_tables(&ddl("page_views.ddl.sql"))
        .partitions(2)
        .records(records)
        .build()
        .await;
    let sql = example("page_views.sql");
    for ((url, pool), mode) in both_modes(&world, "sql_page_views_pm").await {
        let flags = ["--mode", mode, "--batch-size", "3"];
        // A group per mode: both read the whole topic.
        let run = apply(&world, &url, mode, &sql, &flags).await;
        assert_eq!(summary(&run), [11, 8, 3, 0, 0, 1], "{mode}");
        let c = pool.get().await.unwrap();
        let rows = c
            .query(
                "SELECT message_id::text, count(*) FROM page_views GROUP BY 1 ORDER BY 1",
                &[],
            )
            .await
            .unwrap();
        let views: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let once = |ids: &[u32]| ids.iter().map(|i| (uuid(*i), 1)).collect::<Vec<_>>();
        assert_eq!(views, once(&[1, 2, 4, 5, 6, 7, 8]), "{mode}");
        for (table, n) in [
            ("page_views_2025", 2),
            ("page_views_2026", 4),
            ("page_views_2027", 0),
            ("page_views_default", 1),
        ] {
            let sql = format!("SELECT count(*) FROM ONLY {table}");
            assert_eq!(count(&pool, &sql).await, n, "{mode}: {table}");
        }
        let letters = dead_letters(&pool).await;
        assert_eq!(letters.len(), 1, "{mode}: {letters:?}");
        let (partition, offset, id, reason, detail) = &letters[0];
        assert_eq!(
            (*partition, *offset, id.as_deref(), reason.as_str()),
            (0, 3, Some(uuid(3).as_str()), "handler_error")
        );
        assert!(
            detail.contains("violates check constraint \"page_views_path_check\""),
            "{mode}: PostgreSQL's message: {detail}"
        );
        assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 8);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_the_statement_refuses_are_dead_lettered_with_its_reasons() {
    let order = |id, value: &str| record(0, id, None, value);
    let records = [
        order(1, r#"{"order_id": "o1", "sku": "A", "quantity": 2}"#), // 0
        order(1, r#"{"order_id": "o1", "sku": "A", "quantity": 2}"#), // 1: copy
        order(2, r#"{"order_id": "o2", "sku": "B", "quantity": 0}"#), // 2: invalid quantity
        order(3, r#"{"sku": "C", "quantity": 1}"#),                   // 3: no order id
        order(4, r#"{"order_id": "o1", "sku": "A", "quantity": 5}"#), // 4: o1 exists
        order(5, r#"{"order_id": "o3", "sku": "D", "quantity": "7"}"#), // 5: a string
        order(6, r#"{"order_id": "o4", "sku": "E", "quantity": 1}"#), // 6
        order(7, r#"{"order_id": "o4", "sku": "E", "quantity": 9}"#), // 7: o4 in this batch
        order(2, r#"{"order_id": "o2", "sku": "B", "quantity": 0}"#), // 8: copy
    ];
    let world = sql_scenario("sql_orders", "sql-orders")
        .core_tables(&ddl("orders.ddl.sql"))
        .records(records)
        .build()
        .await;
    let expected_letters = vec![
        letter(2, 2, "invalid_quantity", "order o2"),
        letter(3, 3, "missing_order_id", "order without id"),
        letter(4, 4, "duplicate_order", "order o1 exists already"),
        letter(5, 5, "invalid_quantity", "order o3"),
        letter(7, 7, "duplicate_order", "order o4 exists already"),
    ];
    let sql = example("orders_reject.sql");
    for ((url, pool), mode) in both_modes(&world, "sql_orders_pm").await {
        let flags = ["--mode", mode, "--batch-size", "4"];
        // A group per mode: both read the whole topic.
        let run = apply(&world, &url, mode, &sql, &flags).await;
        assert_eq!(summary(&run), [9, 7, 2, 0, 5, 0], "{mode}");
        assert_eq!(dead_letters(&pool).await, expected_letters, "{mode}");
        let c = pool.get().await.unwrap();
        let rows = c
            .query(
                "SELECT order_id, quantity, message_id::text FROM orders ORDER BY 1",
                &[],
            )
            .await
            .unwrap();
        let orders: Vec<(String, i32, String)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        assert_eq!(
            orders,
            vec![("o1".into(), 2, uuid(1)), ("o4".into(), 1, uuid(6))],
            "{mode}"
        );
        // Rejected messages stay in the inbox: a redelivery is a duplicate.
        assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 7);
    }
}

//! A crash between COMMIT and the offset store (`kill -9` by failpoint), then a restart: the
//! batch committed before the crash is delivered again and applies nothing, for each example
//! statement. Kafka's committed offsets only (`--offsets-in-db=false`), so the redelivery does
//! happen. Like module `faults`: the crashing run gets the first half of the input and runs until
//! its failpoint fires; the second half is produced after the crash.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use super::{apply, count, customers, ddl, example, record, sql_scenario, summary, TS_2026};
use crate::common::raw_producer::RawRecord;
use deadpool_postgres::Pool;

const MESSAGES: usize = 80;

/// The input: `MESSAGES` records from `make(i)`, of which every 7th is a copy of the one 3
/// before (same id, same content) and every 11th a copy of one from the first half.
fn input(make: impl Fn(usize) -> RawRecord) -> Vec<RawRecord> {
    let mut records: Vec<RawRecord> = Vec::new();
    for i in 0..MESSAGES {
        let r = if i % 7 == 6 {
            records[i - 3].clone()
        } else if i % 11 == 10 && i > MESSAGES / 2 {
            records[i - MESSAGES / 2].clone()
        } else {
            make(i)
        };
        records.push(r);
    }
    records
}

/// Distinct ids of `records`, in order of first appearance, with their offset (one partition).
fn firsts(records: &[RawRecord]) -> Vec<(usize, &RawRecord)> {
    let mut seen = HashSet::new();
    records
        .iter()
        .enumerate()
        .filter(|(_, r)| seen.insert(r.headers[0].1.clone()))
        .collect()
}

/// Crashes a run after its third COMMIT, before that batch's offset is stored; produces the
/// second half; runs again to the end. Returns the restart's counters (see [`summary`]).
async fn crash_then_restart(
    db: &str,
    tables: &str,
    sql: &str,
    records: &[RawRecord],
) -> (Pool, [u64; 6]) {
    let (first, rest) = records.split_at(MESSAGES / 2);
    let world = sql_scenario(db, db)
        .core_tables(&ddl(tables))
        .records(first.to_vec())
        .build()
        .await;
    let (url, pool) = world.db();
    let sql = example(sql);
    // A short session: the restart does not wait long for the crashed member's partition.
    let flags = [
        "--batch-size",
        "5",
        "--offsets-in-db=false",
        "-X",
        "session.timeout.ms=6000",
        "-X",
        "heartbeat.interval.ms=500",
    ];
    let mut args = vec![
        "--apply-sql",
        sql.to_str().unwrap(),
        "--batch-linger-ms",
        "200",
    ];
    args.extend(flags);
    let failpoint = "after_commit_before_offset=2*off->return(crash)";
    let crashed = world
        .spawn_with("g", &args, &[("FAILPOINTS", failpoint)])
        .wait(Duration::from_secs(120))
        .await;
    assert_ne!(
        crashed.code,
        Some(0),
        "the run must crash: {}",
        crashed.stderr
    );
    assert!(crashed.stderr.contains("crashing"), "{}", crashed.stderr);
    let at_crash = count(&pool, "SELECT count(*) FROM inbox").await;
    assert!(at_crash >= 3, "three batches committed first: {at_crash}");

    world.produce(rest);
    let restart = apply(&world, &url, "g", &sql, &flags).await;
    let counters = summary(&restart);
    let distinct = firsts(records).len() as i64;
    assert!(
        counters[0] > rest.len() as u64,
        "the batch committed before the crash is delivered again: {counters:?}\n{}\n{}",
        restart.stdout,
        restart.stderr
    );
    assert_eq!(
        counters[1] as i64,
        distinct - at_crash,
        "a redelivered id is no new one"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, distinct);
    (pool, counters)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customers_after_a_crash_between_commit_and_offset_store() {
    let records = input(|i| {
        let key = format!("c{}", i % 9);
        record(
            0,
            i as u32 + 1,
            Some(key.as_bytes()),
            &format!(r#"{{"v": {i}}}"#),
        )
    });
    let mut latest: BTreeMap<String, (String, i64)> = BTreeMap::new();
    for (offset, r) in firsts(&records) {
        let key = String::from_utf8(r.key.clone().unwrap()).unwrap();
        let value = String::from_utf8(r.value.clone().unwrap()).unwrap();
        latest.insert(key, (value, offset as i64));
    }
    let expected: Vec<(String, String, i64)> =
        latest.into_iter().map(|(k, (v, o))| (k, v, o)).collect();
    let (pool, _) = crash_then_restart(
        "sql_crash_customers",
        "customers.ddl.sql",
        "customers.sql",
        &records,
    )
    .await;
    assert_eq!(customers(&pool).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_views_after_a_crash_between_commit_and_offset_store() {
    let records = input(|i| RawRecord {
        timestamp_ms: Some(TS_2026 + i as i64),
        ..record(
            0,
            i as u32 + 1,
            None,
            &format!(r#"{{"path": "/p{}"}}"#, i % 5),
        )
    });
    let (pool, _) = crash_then_restart(
        "sql_crash_page_views",
        "page_views.ddl.sql",
        "page_views.sql",
        &records,
    )
    .await;
    let c = pool.get().await.unwrap();
    let rows = c
        .query(
            "SELECT message_id::text FROM page_views ORDER BY source_offset",
            &[],
        )
        .await
        .unwrap();
    let views: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let ids: Vec<String> = firsts(&records)
        .iter()
        .map(|(_, r)| String::from_utf8(r.headers[0].1.clone().unwrap()).unwrap())
        .collect();
    assert_eq!(views, ids, "each view once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_after_a_crash_between_commit_and_offset_store() {
    let records = input(|i| {
        let value = format!(
            r#"{{"order_id": "o{}", "sku": "S", "quantity": {}}}"#,
            i % 30,
            i % 12
        );
        record(0, i as u32 + 1, None, &value)
    });
    // The statement's rules, applied in order to each new message.
    let (mut orders, mut rejected) = (BTreeMap::new(), BTreeMap::<String, i64>::new());
    for (_, r) in firsts(&records) {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let (order, quantity) = (
            v["order_id"].as_str().unwrap(),
            v["quantity"].as_i64().unwrap(),
        );
        let reason = if quantity == 0 {
            "invalid_quantity"
        } else if orders.contains_key(order) {
            "duplicate_order"
        } else {
            orders.insert(order.to_owned(), quantity);
            continue;
        };
        *rejected.entry(reason.to_owned()).or_default() += 1;
    }
    assert!(rejected.len() == 2, "both rules at work: {rejected:?}");
    let (pool, counters) = crash_then_restart(
        "sql_crash_orders",
        "orders.ddl.sql",
        "orders_reject.sql",
        &records,
    )
    .await;
    let c = pool.get().await.unwrap();
    let rows = c
        .query("SELECT order_id, quantity FROM orders", &[])
        .await
        .unwrap();
    let stored: BTreeMap<String, i64> = rows
        .iter()
        .map(|r| (r.get(0), i64::from(r.get::<_, i32>(1))))
        .collect();
    assert_eq!(stored, orders);
    let rows = c
        .query("SELECT reason, count(*) FROM dead_letters GROUP BY 1", &[])
        .await
        .unwrap();
    let letters: BTreeMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(letters, rejected);
    assert_eq!(counters[3], 0, "no invalid record");
}

//! Single records whose bytes once stopped the processor, sent through a real broker by
//! a producer that writes any bytes: each is dead-lettered, the records around it are applied,
//! and the partition moves on. Also: a record larger than the batch byte limit is applied alone.

use crate::common;
use crate::common::raw_producer;
use crate::common::scenario::{Scenario, World};
use std::time::Duration;

use batch_inbox::Mode;
use batch_inbox::StatsSnapshot;
use batch_inbox::{Header, RawMessage};
use bytes::Bytes;
use common::*;
use deadpool_postgres::Pool;
use raw_producer::RawRecord;
use serde_json::json;

/// A ledger record of `account` on partition 0 with id header `id`.
fn ledger(id: &[u8], account: i64, amount: i64) -> RawRecord {
    RawRecord {
        partition: 0,
        key: Some(account.to_string().into_bytes()),
        value: Some(format!(r#"{{"account_id":{account},"amount":{amount}}}"#).into_bytes()),
        headers: vec![(b"id".to_vec(), Some(id.to_vec()))],
        timestamp_ms: None,
    }
}

/// What the consumer makes of `r` (for its size).
fn as_raw(r: &RawRecord) -> RawMessage {
    RawMessage {
        topic: std::sync::Arc::from("t"),
        partition: r.partition,
        offset: 0,
        timestamp_ms: None,
        key: r.key.clone().map(Bytes::from),
        payload: r.value.clone().map(Bytes::from),
        headers: r
            .headers
            .iter()
            .map(|(k, v)| Header {
                key: Bytes::from(k.clone()),
                value: v.clone().map(Bytes::from),
            })
            .collect(),
        header_error: None,
    }
}

/// Runs a ledger processor over the world's topic until it is drained; panics if it stops with
/// an error.
async fn drain_topic(world: &World, max_bytes: usize) -> StatsSnapshot {
    let kafka = world.settings("g");
    // Batches close on bytes or at the end of the partition only: linger batching, so that the
    // batches' shapes are the byte limit's, whatever reaches the worker when.
    let mut cfg = with_linger(config(kafka, Mode::Batched, 100), Duration::from_secs(60));
    cfg.worker.batcher.max_bytes = max_bytes.try_into().unwrap();
    world.run_library(cfg).await
}

async fn dead_letter(
    pool: &Pool,
    offset: i64,
) -> (String, Option<String>, Option<Vec<u8>>, serde_json::Value) {
    let c = pool.get().await.unwrap();
    let row = c
        .query_one(
            "SELECT reason, message_id, message_id_raw, headers FROM dead_letters \
             WHERE \"offset\" = $1",
            &[&offset],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_byte_in_the_id_or_another_header_is_dead_lettered_and_the_partition_moves_on() {
    let mut no_id_nul_value = ledger(b"", 1, 3);
    no_id_nul_value.headers = vec![(b"trace".to_vec(), Some(b"a\0b".to_vec()))];
    let records = [
        ledger(uuid(1).as_bytes(), 1, 5),
        ledger(b"abc\0def", 1, 100),
        no_id_nul_value,
        ledger(uuid(2).as_bytes(), 1, 7),
    ];
    let world = Scenario::new("nul_id").records(records).build().await;
    let pool = world.pool.clone();

    let stats = drain_topic(&world, 4 << 20).await;
    assert_eq!((stats.records, stats.new, stats.invalid), (4, 2, 2));
    let t = tables(&pool).await;
    assert_eq!(t.balances, vec![(1, 12)]);
    let (reason, id, raw_id, _) = dead_letter(&pool, 1).await;
    assert_eq!((reason.as_str(), id), ("invalid_id", None));
    assert_eq!(
        raw_id.as_deref(),
        Some(&b"abc\0def"[..]),
        "the id kept as bytes"
    );
    let (reason, id, raw_id, headers) = dead_letter(&pool, 2).await;
    assert_eq!((reason.as_str(), id, raw_id), ("missing_id", None, None));
    assert_eq!(headers, json!([{"key": "trace", "value_hex": "610062"}]));

    // The offsets moved past them: the same group has nothing left to read.
    let again = drain_topic(&world, 4 << 20).await;
    assert_eq!(again.records, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_or_holds_a_nul_stops_nothing() {
    let mut applied_anyway = ledger(uuid(1).as_bytes(), 2, 5);
    applied_anyway
        .headers
        .push((vec![0xff, 0xfe], Some(b"x".to_vec())));
    let mut no_id = ledger(b"", 2, 1);
    no_id.headers = vec![(vec![0xc3, 0x28, 0x00, 0x41], None)];
    // librdkafka hands names out NUL-terminated: "id\0tail" reads as a second "id" header.
    let mut cut_name = ledger(uuid(2).as_bytes(), 2, 1);
    cut_name
        .headers
        .push((b"id\0tail".to_vec(), Some(b"other".to_vec())));
    let records = [
        applied_anyway,
        no_id,
        cut_name,
        ledger(uuid(3).as_bytes(), 2, 7),
    ];
    let world = Scenario::new("binary_header_name")
        .records(records)
        .build()
        .await;
    let pool = world.pool.clone();

    let stats = drain_topic(&world, 4 << 20).await;
    assert_eq!((stats.records, stats.new, stats.invalid), (4, 2, 2));
    assert_eq!(tables(&pool).await.balances, vec![(2, 12)]);
    let (reason, _, _, headers) = dead_letter(&pool, 1).await;
    assert_eq!(reason, "missing_id");
    assert_eq!(
        headers,
        json!([{"key_hex": "c328", "value": null}]),
        "cut at the NUL"
    );
    let (reason, _, _, headers) = dead_letter(&pool, 2).await;
    assert_eq!(reason, "invalid_id");
    assert_eq!(headers[1], json!({"key": "id", "value": "other"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_larger_than_the_batch_byte_limit_is_applied_alone() {
    let small = |n: u32| ledger(uuid(n).as_bytes(), 3, 1);
    let mut big = ledger(uuid(4).as_bytes(), 3, 10);
    let value = big.value.as_mut().unwrap();
    value.extend(std::iter::repeat_n(b' ', 20_000));
    let records = [
        small(1),
        small(2),
        small(3),
        big,
        small(5),
        small(6),
        small(7),
    ];
    // The byte limit holds three small records, not a fourth, and not the big one.
    let size = |r: &RawRecord| as_raw(r).size_bytes();
    let limit = 3 * size(&records[0]) + size(&records[0]) / 2;
    assert!(size(&records[3]) > limit + 10_000);
    let world = Scenario::new("big_record").records(records).build().await;
    let pool = world.pool.clone();

    let stats = drain_topic(&world, limit).await;
    assert_eq!((stats.records, stats.new, stats.duplicates), (7, 7, 0));
    assert_eq!(tables(&pool).await.balances, vec![(3, 16)]);
    assert_eq!(
        stats.transactions, 3,
        "[1, 2, 3] closed by the big record, [big] alone, [5, 6, 7] at the end"
    );
    assert_eq!(tables(&pool).await.inbox.len(), 7);
}

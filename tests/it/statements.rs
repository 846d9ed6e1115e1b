//! The batched inbox costs a constant number of round trips per batch, whatever its size;
//! the per-message baseline costs a constant number per message.

use crate::common;
use std::sync::Arc;

use batch_inbox::db;
use batch_inbox::internals::inbox::Inbox;
use batch_inbox::ledger::Ledger;
use batch_inbox::{Header, RawMessage};
use batch_inbox_tools::generate::{Generator, GeneratorSettings};
use bytes::Bytes;
use common::*;

fn batch(first_offset: i64, n: usize, seed: u64) -> Vec<RawMessage> {
    let settings = GeneratorSettings {
        messages: n as u64,
        accounts: 3,
        duplicate_ratio: 0.3,
        bad_ratio: 0.2,
        debit_ratio: 0.6,
        id_version: 7,
        seed,
        ..GeneratorSettings::default()
    };
    Generator::new(settings)
        .enumerate()
        .map(|(i, r)| RawMessage {
            topic: Arc::from("t"),
            partition: 0,
            offset: first_offset + i as i64,
            timestamp_ms: None,
            key: Some(Bytes::from(r.key)),
            payload: r.value.map(Bytes::from),
            headers: r
                .id
                .map(|id| Header {
                    key: "id".into(),
                    value: Some(Bytes::from(id)),
                })
                .into_iter()
                .collect(),
            header_error: None,
        })
        .collect()
}

#[tokio::test]
async fn statements_per_batch_do_not_grow_with_batch_size() {
    let (_, _pool) = fresh_db("statements").await;
    let counter = RoundTripCounter::start().await;
    let pool = db::connect(&counter.url(&common::db_name("statements")), 1)
        .await
        .unwrap();
    // As in production: each transaction also stores the partition's next offset, in a CTE of
    // the inbox statement, so the counts below are the same as without it.
    let inbox = Inbox::new(pool.clone(), Arc::new(Ledger), "id").with_offsets_in_db(Some("g"));

    // Warm up: the first batches prepare the statements on the connection (the first creates
    // the accounts, the second updates them) and are not counted.
    for (offset, seed) in [(0, 1), (100, 6)] {
        let warm = inbox.decode(batch(offset, 50, seed));
        inbox.apply_batch("t", 0, &warm).await.unwrap();
    }
    let warm_one = inbox.decode(vec![ledger_record(499, &uuid(499), 98, 5)]);
    inbox.apply_batch("t", 0, &warm_one).await.unwrap();
    let before = counter.get();
    let with_new_account = inbox.decode(vec![ledger_record(500, &uuid(500), 99, 5)]);
    let outcome = inbox.apply_batch("t", 0, &with_new_account).await.unwrap();
    assert_eq!((outcome.new, outcome.rejected), (1, 0));
    // A batch of one message takes the per-message statements: BEGIN, the one-id inbox insert
    // (with the offset), create the account, apply the amount, COMMIT; no dead letters.
    assert_eq!(
        counter.get() - before,
        5,
        "a batch of one message that creates an account"
    );

    let mut costs = Vec::new();
    let mut offset = 1_000;
    for (n, seed) in [(10, 2), (100, 3), (1_000, 4), (5_000, 5)] {
        let decoded = inbox.decode(batch(offset, n, seed));
        assert!(
            !decoded.dead_letters.is_empty(),
            "the batch has bad input to record"
        );
        offset += n as i64;
        let before = counter.get();
        let outcome = inbox.apply_batch("t", 0, &decoded).await.unwrap();
        assert!(outcome.new > 0 && outcome.duplicates > 0 && outcome.rejected > 0);
        costs.push(counter.get() - before);
    }
    // The warm-up created every account: BEGIN, inbox insert, savepoint and guarded update
    // (one round trip), lock of the accounts with a refused debit, write of their balances,
    // dead letters, COMMIT.
    assert_eq!(
        costs,
        vec![8, 8, 8, 8],
        "round trips per batch of 10, 100, 1000, 5000"
    );
    let stored: i64 = pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT next_offset FROM consumer_offsets", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        stored, offset,
        "the last batch's next offset, in the same round trips"
    );
}

#[tokio::test]
async fn per_message_baseline_pays_a_transaction_per_message() {
    let (_, _pool) = fresh_db("statements_one").await;
    let counter = RoundTripCounter::start().await;
    let pool = db::connect(&counter.url(&common::db_name("statements_one")), 1)
        .await
        .unwrap();
    let inbox = Inbox::new(pool, Arc::new(Ledger), "id").with_offsets_in_db(Some("g"));
    let records = batch(0, 200, 9);
    for r in records.iter().take(20).cloned() {
        inbox
            .apply_one("t", 0, &inbox.decode(vec![r]))
            .await
            .unwrap();
    }
    let before = counter.get();
    let mut transactions = 0;
    for r in records.into_iter().skip(20) {
        inbox
            .apply_one("t", 0, &inbox.decode(vec![r]))
            .await
            .unwrap();
        transactions += 1;
    }
    let per_message = (counter.get() - before) as f64 / transactions as f64;
    // BEGIN, inbox insert, ensure account, update, COMMIT: about five round trips each.
    assert!(
        (3.0..=6.0).contains(&per_message),
        "{per_message} round trips per message"
    );
}

/// The dedup statement probes the primary key once per id, whatever plan a connection keeps for
/// it: the generic plan made while the inbox is empty and never analyzed must not read the whole
/// inbox for each batch.
#[tokio::test]
async fn the_dedup_statement_never_reads_the_whole_inbox() {
    let (url, _pool) = fresh_db("dedup_plan").await;
    let pool = db::connect(&url, 1).await.unwrap();
    let inbox = Inbox::new(pool.clone(), Arc::new(Ledger), "id").with_offsets_in_db(Some("g"));
    inbox
        .apply_batch("t", 0, &inbox.decode(batch(0, 20, 3)))
        .await
        .unwrap();
    // The connection that prepared the statement, planning it generically now.
    let c = pool.get().await.unwrap();
    c.batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    let name: String = c
        .query_one(
            "SELECT name FROM pg_prepared_statements
             WHERE statement LIKE '%INSERT INTO inbox %' AND name <> ''
               AND statement NOT LIKE '%pg_prepared_statements%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let plan: Vec<String> = c
        .query(
            &format!("EXPLAIN EXECUTE {name}('{{}}', 't', 0, '{{}}', 'g', 1, NULL)"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(!plan.contains("Seq Scan on inbox"), "{plan}");
    assert!(plan.contains("inbox_pkey"), "{plan}");
}

//! The reset printed when a topic was deleted and re-created, run on a real database: against a
//! real broker (`KAFKA_BROKERS`; librdkafka's mock cluster answers no DescribeTopics), a group
//! whose stored offsets belong to another topic id stops with `TopicReplaced`, and its reset
//! removes the group's offsets, its recorded id and exactly the inbox rows keyed by the old
//! topic's positions; every other row (UUID ids, keys of id values, other topics' positions)
//! stays.

use std::future::pending;
use std::sync::Arc;
use std::time::Duration;

use batch_inbox::key::{id_key, position_key};
use batch_inbox::ledger::Ledger;
use batch_inbox::{IdRules, IdSource};
use batch_inbox::{Mode, RunError};
use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::common::raw_producer::RawRecord;
use crate::common::scenario::Scenario;
use crate::common::{config, drain};

const ENTRY: &[u8] = br#"{"account_id": 1, "amount": 10}"#;

async fn inbox(pool: &Pool) -> Vec<(Uuid, String, i32, i64)> {
    let c = pool.get().await.unwrap();
    c.query(
        "SELECT message_id, topic, partition, \"offset\" FROM inbox ORDER BY 2, 3, 4, 1",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

async fn count(pool: &Pool, table: &str) -> i64 {
    let c = pool.get().await.unwrap();
    let sql = format!("SELECT count(*) FROM {table}");
    c.query_one(&sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_replaced_reset_removes_exactly_the_old_positions_inbox_rows() {
    let entry = RawRecord {
        partition: 0,
        key: None,
        value: Some(ENTRY.to_vec()),
        headers: Vec::new(),
        timestamp_ms: None,
    };
    let world = Scenario::new("topic_replaced_reset")
        .topic("replaced-reset")
        .records(vec![entry; 3])
        .build()
        .await;
    let (pool, topic, group) = (world.pool.clone(), world.topic.clone(), world.group("g"));
    let mut ids = IdRules::header("id");
    ids.source = IdSource::Position;
    let by_position = || {
        let mut c = config(world.settings("g"), Mode::Batched, 50);
        c.decoding.ids = ids.clone();
        c
    };
    drain(by_position(), &pool).await;
    let applied: Vec<_> = (0..3)
        .map(|o| (position_key(&topic, 0, o), topic.clone(), 0, o))
        .collect();
    assert_eq!(inbox(&pool).await, applied);

    // Rows the reset must keep: a UUID id and a key of an id value on the topic, and another
    // topic's position key (what `--id-from position` wrote for it).
    let uuid_id = Uuid::from_u128(0x0191e5a0_0000_7000_8000_000000000001);
    let value_key = id_key(&topic, b"order-1");
    let other = position_key("other", 0, 1);
    let c = pool.get().await.unwrap();
    for (id, t, o) in [
        (uuid_id, topic.as_str(), 7_i64),
        (value_key, topic.as_str(), 8),
        (other, "other", 1),
    ] {
        c.execute(
            "INSERT INTO inbox (message_id, topic, partition, \"offset\") VALUES ($1, $2, 0, $3)",
            &[&id, &t, &o],
        )
        .await
        .unwrap();
    }
    // The stored offsets now belong to another incarnation of the topic.
    c.execute(
        "INSERT INTO consumer_topics (group_id, topic, topic_id) VALUES ($1, $2, $3)
         ON CONFLICT (group_id, topic) DO UPDATE SET topic_id = excluded.topic_id",
        &[&group, &topic, &Uuid::from_u128(42)],
    )
    .await
    .unwrap();

    let run = batch_inbox::run(by_position(), pool.clone(), Arc::new(Ledger), pending());
    let failed = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("stopped within 60 s");
    let reset = match failed {
        Err(RunError::TopicReplaced { reset, .. }) => reset,
        Err(other) => panic!("not stopped as a replaced topic: {other}"),
        Ok(_) => panic!("ran to the end: the replaced topic was not noticed"),
    };
    c.batch_execute(&reset).await.unwrap();

    let mut kept = vec![
        (other, "other".to_owned(), 0, 1),
        (uuid_id, topic.clone(), 0, 7),
        (value_key, topic.clone(), 0, 8),
    ];
    kept.sort_by(|a, b| (&a.1, a.2, a.3).cmp(&(&b.1, b.2, b.3)));
    assert_eq!(inbox(&pool).await, kept);
    assert_eq!(count(&pool, "consumer_offsets").await, 0);
    assert_eq!(count(&pool, "consumer_topics").await, 0);
    assert_eq!(
        crate::common::tables(&pool).await.balances,
        [(1, 30)],
        "the reset touches no business table"
    );
}

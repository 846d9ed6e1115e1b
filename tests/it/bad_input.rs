//! Bad input ends as a dead-letter record, in the batch's transaction, and the partition moves on.

use crate::common;
use batch_inbox::Mode;
use common::raw_producer::RawRecord;
use common::scenario::Scenario;
use common::*;
use serde_json::json;

const GOOD: &[u8] = br#"{"account_id": 3, "amount": 5}"#;

/// A record of partition 0 with `key`, `value` and `headers`.
fn raw(key: Option<&str>, value: Option<&[u8]>, headers: &[(&str, Option<&[u8]>)]) -> RawRecord {
    RawRecord {
        partition: 0,
        key: key.map(|k| k.as_bytes().to_vec()),
        value: value.map(<[u8]>::to_vec),
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.map(<[u8]>::to_vec)))
            .collect(),
        timestamp_ms: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_kind_is_dead_lettered_and_the_partition_moves_on() {
    let id = |n| uuid(n);
    let wrong_types = br#"{"account_id": "3", "amount": 5}"#;
    let missing_field = br#"{"account_id": 3}"#;
    let trace: (&str, Option<&[u8]>) = ("trace", Some(b"t-1"));
    let world = Scenario::new("bad_input")
        .mock()
        .entry(0, &id(1), 3, 5) // 0: good
        .records([
            raw(Some("3"), Some(GOOD), &[]),             // 1: no id header
            raw(Some("3"), Some(GOOD), &[("id", None)]), // 2: null id header
            raw(Some("3"), Some(GOOD), &[("id", Some(b"12345"))]), // 3: not a UUID
            raw(Some("3"), Some(GOOD), &[("id", Some(&[0xff, 0xfe]))]), // 4: not UTF-8
            raw(Some("3"), None, &[("id", Some(id(5).as_bytes()))]), // 5: no value
            raw(Some("3"), Some(b""), &[("id", Some(id(6).as_bytes()))]), // 6: empty value
            raw(
                Some("3"),
                Some(b"not json"),
                &[("id", Some(id(7).as_bytes()))],
            ), // 7
            raw(
                Some("3"),
                Some(wrong_types),
                &[("id", Some(id(8).as_bytes()))],
            ), // 8
            raw(
                None,
                Some(missing_field),
                &[("id", Some(id(9).as_bytes())), trace],
            ), // 9
        ])
        .entry(0, &id(10), 3, 7) // 10: good
        .build()
        .await;
    let (pool, kafka) = (world.pool.clone(), world.kafka());

    let stats = drain(config(kafka.settings("g"), Mode::Batched, 100), &pool).await;
    assert_eq!((stats.records, stats.new, stats.invalid), (11, 2, 9));

    let t = tables(&pool).await;
    assert_eq!(t.balances, vec![(3, 12)]);
    assert_eq!(t.inbox.len(), 2, "bad records never reach the inbox");
    let reasons: Vec<(i64, &str)> = t.dead_letters.iter().map(|d| (d.1, d.3.as_str())).collect();
    assert_eq!(
        reasons,
        vec![
            (1, "missing_id"),
            (2, "missing_id"),
            (3, "invalid_id"),
            (4, "invalid_id"),
            (5, "empty_payload"),
            (6, "empty_payload"),
            (7, "invalid_payload"),
            (8, "invalid_payload"),
            (9, "invalid_payload"),
        ]
    );

    // The raw record is kept: key, value, headers, and the id text even when it is not a UUID.
    let c = pool.get().await.unwrap();
    let row = c
        .query_one(
            "SELECT message_id, key, payload, headers, detail FROM dead_letters WHERE \"offset\" = 9",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0), Some(id(9)));
    assert_eq!(row.get::<_, Option<Vec<u8>>>(1), None);
    assert_eq!(
        row.get::<_, Option<Vec<u8>>>(2).as_deref(),
        Some(&missing_field[..])
    );
    assert_eq!(
        row.get::<_, serde_json::Value>(3),
        json!([{"key": "id", "value": id(9)}, {"key": "trace", "value": "t-1"}])
    );
    assert!(
        row.get::<_, String>(4).contains("amount"),
        "detail names the problem"
    );
    let not_uuid: Option<String> = c
        .query_one(
            "SELECT message_id FROM dead_letters WHERE \"offset\" = 3",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(not_uuid.as_deref(), Some("12345"));

    // Redelivery of the whole partition adds no dead letter and applies nothing.
    let again = drain(
        config(kafka.settings("other-group"), Mode::Batched, 100),
        &pool,
    )
    .await;
    assert_eq!((again.new, again.dead_letters_written), (0, 0));
    assert_eq!(tables(&pool).await, t);

    // The offsets moved past the bad records: the same group has nothing left to read.
    let same = drain(config(kafka.settings("g"), Mode::Batched, 100), &pool).await;
    assert_eq!(same.records, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_header_of_another_name_can_be_used() {
    let id = uuid(1);
    let value = br#"{"account_id": 4, "amount": 9}"#;
    let record = raw(Some("4"), Some(value), &[("ce_id", Some(id.as_bytes()))]);
    let world = Scenario::new("ce_id")
        .mock()
        .records([record.clone(), record])
        .build()
        .await;
    let pool = world.pool.clone();
    let mut cfg = config(world.settings("g"), Mode::Batched, 1);
    cfg.decoding.ids.header = "ce_id".to_owned();
    let stats = drain(cfg, &pool).await;
    assert_eq!((stats.new, stats.duplicates, stats.invalid), (1, 1, 0));
    assert_eq!(tables(&pool).await.balances, vec![(4, 9)]);
}

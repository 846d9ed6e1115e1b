//! Bad input ends as a dead-letter record, in the batch's transaction, and the partition moves on.

use crate::common;
use batch_inbox::Mode;
use common::*;
use serde_json::json;

const GOOD: &[u8] = br#"{"account_id": 3, "amount": 5}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_kind_is_dead_lettered_and_the_partition_moves_on() {
    let (_, pool) = fresh_db("bad_input").await;
    let kafka = Kafka::new("bad-input", 1);
    let id = |n| uuid(n);
    kafka.send_entry(0, &id(1), 3, 5).await; // 0: good
    kafka.send(0, Some("3"), Some(GOOD), &[]).await; // 1: no id header
    kafka.send(0, Some("3"), Some(GOOD), &[("id", None)]).await; // 2: null id header
    kafka
        .send(0, Some("3"), Some(GOOD), &[("id", Some(b"12345"))])
        .await; // 3: not a UUID
    kafka
        .send(0, Some("3"), Some(GOOD), &[("id", Some(&[0xff, 0xfe]))])
        .await; // 4: not UTF-8
    kafka
        .send(0, Some("3"), None, &[("id", Some(id(5).as_bytes()))])
        .await; // 5: no value
    kafka
        .send(0, Some("3"), Some(b""), &[("id", Some(id(6).as_bytes()))])
        .await; // 6: empty value
    kafka
        .send(
            0,
            Some("3"),
            Some(b"not json"),
            &[("id", Some(id(7).as_bytes()))],
        )
        .await; // 7
    let wrong_types = br#"{"account_id": "3", "amount": 5}"#;
    kafka
        .send(
            0,
            Some("3"),
            Some(wrong_types),
            &[("id", Some(id(8).as_bytes()))],
        )
        .await; // 8
    let missing_field = br#"{"account_id": 3}"#;
    kafka
        .send(
            0,
            None,
            Some(missing_field),
            &[("id", Some(id(9).as_bytes())), ("trace", Some(b"t-1"))],
        )
        .await; // 9
    kafka.send_entry(0, &id(10), 3, 7).await; // 10: good

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
    let (_, pool) = fresh_db("ce_id").await;
    let kafka = Kafka::new("ce-id", 1);
    let id = uuid(1);
    for _ in 0..2 {
        kafka
            .send(
                0,
                Some("4"),
                Some(br#"{"account_id": 4, "amount": 9}"#),
                &[("ce_id", Some(id.as_bytes()))],
            )
            .await;
    }
    let mut cfg = config(kafka.settings("g"), Mode::Batched, 1);
    cfg.decoding.ids.header = "ce_id".to_owned();
    let stats = drain(cfg, &pool).await;
    assert_eq!((stats.new, stats.duplicates, stats.invalid), (1, 1, 0));
    assert_eq!(tables(&pool).await.balances, vec![(4, 9)]);
}

//! Dead-letter rows hold any bytes, against the real PostgreSQL: NUL bytes and invalid UTF-8 in
//! the id header and in other headers' names and values, an unbounded id; and a row PostgreSQL
//! still refuses is written in minimal form while the batch commits.

use crate::common;
use std::sync::Arc;

use batch_inbox::internals::inbox::Inbox;
use batch_inbox::internals::inbox::MAX_DETAIL_BYTES;
use batch_inbox::ledger::Ledger;
use batch_inbox::{Header, RawMessage};
use bytes::Bytes;
use common::*;
use deadpool_postgres::Pool;
use serde_json::json;

const GOOD: &[u8] = br#"{"account_id": 1, "amount": 2}"#;

fn record(offset: i64, headers: &[(&[u8], Option<&[u8]>)]) -> RawMessage {
    RawMessage {
        topic: Arc::from("t"),
        partition: 0,
        offset,
        timestamp_ms: None,
        key: Some(Bytes::from_static(&[0x00, 0xff])),
        payload: Some(Bytes::from_static(GOOD)),
        headers: headers
            .iter()
            .map(|(k, v)| Header {
                key: Bytes::copy_from_slice(k),
                value: v.map(Bytes::copy_from_slice),
            })
            .collect(),
        header_error: None,
    }
}

type Letter = (
    String,
    Option<String>,
    Option<Vec<u8>>,
    Option<String>,
    Option<Vec<u8>>,
    Option<serde_json::Value>,
);

async fn letter(pool: &Pool, offset: i64) -> Letter {
    let c = pool.get().await.unwrap();
    let r = c
        .query_one(
            "SELECT reason, message_id, message_id_raw, detail, key, headers FROM dead_letters \
             WHERE \"offset\" = $1",
            &[&offset],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))
}

#[tokio::test]
async fn any_bytes_in_headers_are_stored_and_the_batch_commits() {
    let (_, pool) = fresh_db("dl_bytes").await;
    let inbox = Inbox::new(pool.clone(), Arc::new(Ledger), "id");
    let huge_id = [&b"x"[..]; 10_000].concat();
    let batch = vec![
        ledger_record(0, &uuid(1), 1, 5),
        record(1, &[(b"id", Some(b"abc\0def"))]),
        record(2, &[(b"trace", Some(b"a\0b")), (&[0xff], Some(&[0xfe]))]),
        record(3, &[(b"id", Some(&huge_id))]),
        ledger_record(4, &uuid(2), 1, 7),
    ];
    let outcome = inbox
        .apply_batch("t", 0, &inbox.decode(batch))
        .await
        .unwrap();
    assert_eq!(
        (outcome.new, outcome.invalid, outcome.dead_letters_written),
        (2, 3, 3)
    );
    assert_eq!(tables(&pool).await.balances, vec![(1, 12)]);

    let (reason, id, raw_id, _, key, _) = letter(&pool, 1).await;
    assert_eq!((reason.as_str(), id), ("invalid_id", None));
    assert_eq!(raw_id.as_deref(), Some(&b"abc\0def"[..]));
    assert_eq!(key.as_deref(), Some(&[0x00, 0xff][..]));
    let (reason, _, raw_id, _, _, headers) = letter(&pool, 2).await;
    assert_eq!((reason.as_str(), raw_id), ("missing_id", None));
    assert_eq!(
        headers,
        Some(json!([
            {"key": "trace", "value_hex": "610062"},
            {"key_hex": "ff", "value_hex": "fe"},
        ]))
    );
    let (reason, id, raw_id, detail, _, _) = letter(&pool, 3).await;
    assert_eq!(
        (reason.as_str(), id),
        ("invalid_id", None),
        "too long for text"
    );
    assert_eq!(raw_id.map(|r| r.len()), Some(10_000), "kept whole as bytes");
    assert!(detail.unwrap().len() <= MAX_DETAIL_BYTES);
}

#[tokio::test]
async fn a_dead_letter_row_the_database_refuses_is_written_in_minimal_form() {
    let (_, pool) = fresh_db("dl_minimal").await;
    // Stands for any row PostgreSQL refuses for its content: headers over 200 bytes.
    pool.get()
        .await
        .unwrap()
        .batch_execute(
            "ALTER TABLE dead_letters ADD CONSTRAINT test_small_headers \
             CHECK (headers IS NULL OR pg_column_size(headers) < 200)",
        )
        .await
        .unwrap();
    let inbox = Inbox::new(pool.clone(), Arc::new(Ledger), "id");
    let big = [&b"z"[..]; 1_000].concat();
    let batch = vec![
        ledger_record(0, &uuid(1), 1, 5),
        record(1, &[(b"trace", Some(&big))]),
        record(2, &[(b"id", Some(b"not-a-uuid"))]),
        ledger_record(3, &uuid(2), 1, 7),
    ];
    let outcome = inbox
        .apply_batch("t", 0, &inbox.decode(batch))
        .await
        .unwrap();
    assert_eq!((outcome.new, outcome.dead_letters_written), (2, 2));
    assert_eq!(tables(&pool).await.balances, vec![(1, 12)]);
    for offset in [1, 2] {
        let (_, id, raw_id, detail, key, headers) = letter(&pool, offset).await;
        assert_eq!((id, raw_id, headers), (None, None, None), "minimal form");
        assert_eq!(key.as_deref(), Some(&[0x00, 0xff][..]), "key kept");
        let detail = detail.unwrap();
        assert!(detail.contains("SQLSTATE 23514"), "{detail}");
    }
    let reasons: Vec<String> = tables(&pool)
        .await
        .dead_letters
        .into_iter()
        .map(|d| d.3)
        .collect();
    assert_eq!(reasons, vec!["missing_id", "invalid_id"]);

    // The per-message baseline does the same.
    let one = inbox.decode(vec![record(4, &[(b"trace", Some(&big))])]);
    let outcome = inbox.apply_one("t", 0, &one).await.unwrap();
    assert_eq!(outcome.dead_letters_written, 1);
    assert_eq!(letter(&pool, 4).await.5, None);
}

//! Topics as they come, through the binary and a real broker: a compacted topic with tombstones,
//! CloudEvents with string ids, ids from keys and positions, values that are not JSON. Each ends
//! in an exact table, and a replay by a new group changes nothing.

use batch_inbox::key::{id_key, position_key};
use serde_json::json;

use super::*;

/// A record of `partition` with `headers`, a key and a value (`None`: a tombstone).
fn raw(
    partition: i32,
    headers: &[(&str, &[u8])],
    key: Option<&str>,
    value: Option<&str>,
) -> RawRecord {
    RawRecord {
        partition,
        key: key.map(|k| k.as_bytes().to_vec()),
        value: value.map(|v| v.as_bytes().to_vec()),
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), Some(v.to_vec())))
            .collect(),
        timestamp_ms: None,
    }
}

/// An upsert of customer `key` with id header `uuid(id)`.
fn upsert(partition: i32, id: u32, key: &str, n: u32) -> RawRecord {
    let doc = format!("{{\"n\": {n}}}");
    record(partition, id, Some(key.as_bytes()), &doc)
}

/// A tombstone of `key`, without an id header (as Debezium writes them).
fn tombstone(partition: i32, key: &str) -> RawRecord {
    raw(partition, &[], Some(key), None)
}

async fn inbox(pool: &Pool) -> Vec<(String, i32, i64)> {
    let c = pool.get().await.unwrap();
    let rows = c
        .query(
            "SELECT message_id::text, partition, \"offset\" FROM inbox ORDER BY 2, 3",
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_with_tombstones_ends_as_its_latest_state() {
    let p0 = [
        upsert(0, 1, "c1", 1),
        upsert(0, 2, "c2", 2),
        upsert(0, 3, "c1", 3),
        tombstone(0, "c2"),
        upsert(0, 4, "c3", 4),
        // A tombstone that carries its id header keeps that id.
        raw(0, &[("id", uuid(5).as_bytes())], Some("c3"), None),
        upsert(0, 6, "c3", 6), // re-created after its delete
        upsert(0, 3, "c1", 3), // a producer's resend: a duplicate
        tombstone(0, "c9"),    // of a customer never seen: deletes nothing
    ];
    let p1 = [upsert(1, 7, "d1", 7), tombstone(1, "d1")];
    let records: Vec<RawRecord> = p0.iter().chain(&p1).cloned().collect();
    let world = sql_scenario("sql_tombstones", "sql-tombstones")
        .core_tables(&ddl("customers.ddl.sql"))
        .partitions(2)
        .records(records)
        .build()
        .await;
    let ((url, pool), topic) = (world.db(), world.topic.clone());
    let sql = example("customers.sql");
    // Small batches: the upsert, the delete and the re-creation of c3 land in different ones.
    let run = apply(&world, &url, "g", &sql, &["--batch-size", "2"]).await;
    assert_eq!(summary(&run), [11, 10, 1, 0, 0, 0]);
    let expected = vec![
        ("c1".to_owned(), "{\"n\": 3}".to_owned(), 2),
        ("c3".to_owned(), "{\"n\": 6}".to_owned(), 6),
    ];
    assert_eq!(customers(&pool).await, expected);
    assert!(dead_letters(&pool).await.is_empty());
    // Tombstones without the header take the key of their position; the others keep their id.
    let mut keys: Vec<(String, i32, i64)> = [(1, 0), (2, 1), (3, 2), (4, 4), (5, 5), (6, 6)]
        .map(|(id, offset)| (uuid(id), 0, offset))
        .into_iter()
        .chain([(uuid(7), 1, 0)])
        .chain(
            [(0, 3), (0, 8), (1, 1)].map(|(p, o)| (position_key(&topic, p, o).to_string(), p, o)),
        )
        .collect();
    keys.sort_by_key(|(_, p, o)| (*p, *o));
    assert_eq!(inbox(&pool).await, keys);

    let replay = apply(&world, &url, "replay", &sql, &[]).await;
    assert_eq!(
        summary(&replay),
        [11, 0, 11, 0, 0, 0],
        "a replay applies nothing"
    );
    assert_eq!(customers(&pool).await, expected);
    assert_eq!(inbox(&pool).await.len(), 10);

    // Dead-lettered on request instead.
    let (url2, pool2) = world.database("sql_tombstones_dl").await;
    let refused = apply(&world, &url2, "dl", &sql, &["--tombstones", "dead-letter"]).await;
    assert_eq!(
        summary(&refused)[3],
        4,
        "four tombstones: {}",
        refused.stdout
    );
    let reasons: Vec<(i32, i64, String)> = dead_letters(&pool2)
        .await
        .into_iter()
        .map(|(p, o, _, reason, _)| (p, o, reason))
        .collect();
    let empty = |p, o| (p, o, "empty_payload".to_owned());
    assert_eq!(
        reasons,
        [empty(0, 3), empty(0, 5), empty(0, 8), empty(1, 1)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_with_string_ids_are_applied_once_per_id() {
    let uuid_upper = "0191E5A0-0000-7000-8000-0000000000AB";
    let uuid_lower = "0191e5a0-0000-7000-8000-0000000000ab";
    let event = |id: &[u8], n: u32| {
        let data = format!("{{\"n\": {n}}}");
        raw(
            0,
            &[
                ("ce_specversion", b"1.0"),
                ("ce_id", id),
                ("ce_type", b"order.created"),
                ("ce_source", b"/shop"),
            ],
            None,
            Some(data.as_str()),
        )
    };
    let records = [
        event(b"order-42", 1),
        event(b"order-42", 2), // a duplicate: the same id
        event(b"Order-42", 3), // differs in case only: another event
        event(b"order-43", 4), // differs in one byte
        event(uuid_upper.as_bytes(), 5),
        event(uuid_lower.as_bytes(), 6), // the same UUID in another case: a duplicate
        event(b"\xffbinary", 7),         // not UTF-8
        event(b"", 8),                   // empty: not an id
        raw(0, &[("ce_type", b"x")], None, Some("{}")), // no ce_id
    ];
    let world = sql_scenario("sql_cloudevents", "sql-cloudevents")
        .core_tables(&ddl("events.ddl.sql"))
        .records(records)
        .build()
        .await;
    let ((url, pool), topic) = (world.db(), world.topic.clone());
    let sql = example("events.sql");
    let flags = ["--id-header", "ce_id", "--id-format", "any"];
    let run = apply(&world, &url, "g", &sql, &flags).await;
    assert_eq!(summary(&run), [9, 5, 2, 2, 0, 0]);
    let c = pool.get().await.unwrap();
    let rows = c
        .query(
            "SELECT message_id::text, event_id, type, source, data::text, \"offset\"
             FROM events ORDER BY \"offset\"",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, String, String, String, String, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    let row = |key: String, id: &str, n: u32, offset: i64| {
        let data = format!("{{\"n\": {n}}}");
        (
            key,
            id.to_owned(),
            "order.created".to_owned(),
            "/shop".to_owned(),
            data,
            offset,
        )
    };
    let key = |id: &[u8]| id_key(&topic, id).to_string();
    assert_eq!(
        got,
        [
            row(key(b"order-42"), "order-42", 1, 0),
            row(key(b"Order-42"), "Order-42", 3, 2),
            row(key(b"order-43"), "order-43", 4, 3),
            row(uuid_lower.to_owned(), uuid_lower, 5, 4),
            row(key(b"\xffbinary"), "{\"hex\": \"ff62696e617279\"}", 7, 6),
        ]
    );
    let letters: Vec<(i64, Option<String>, String)> = dead_letters(&pool)
        .await
        .into_iter()
        .map(|(_, o, id, reason, _)| (o, id, reason))
        .collect();
    assert_eq!(
        letters,
        [
            (7, Some(String::new()), "invalid_id".to_owned()),
            (8, None, "missing_id".to_owned())
        ]
    );
    let replay = apply(&world, &url, "replay", &sql, &flags).await;
    assert_eq!(summary(&replay), [9, 0, 7, 2, 0, 0]);
    assert_eq!(count(&pool, "SELECT count(*) FROM events").await, 5);
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 5);

    // Today's rule by default: only UUIDs are ids.
    let (url2, pool2) = world.database("sql_cloudevents_uuid").await;
    let strict = apply(&world, &url2, "uuid", &sql, &["--id-header", "ce_id"]).await;
    assert_eq!(summary(&strict), [9, 1, 1, 7, 0, 0]);
    assert_eq!(count(&pool2, "SELECT count(*) FROM events").await, 1);
}

/// A statement that records each element whole, to check what the statement sees.
fn elements_sql(dir: &Path) -> PathBuf {
    let path = dir.join("elements.sql");
    std::fs::write(
        &path,
        "INSERT INTO elements (message_id, element)
         SELECT (e ->> 'message_id')::uuid, e FROM jsonb_array_elements($1) AS e",
    )
    .unwrap();
    path
}

/// The table of [`elements_sql`].
const ELEMENTS: &str =
    "CREATE TABLE elements (message_id uuid PRIMARY KEY, element jsonb NOT NULL)";

/// `(message_id, the element's fields named in `fields`)` of every element, in offset order.
async fn elements(pool: &Pool, fields: &[&str]) -> Vec<(String, serde_json::Value)> {
    let c = pool.get().await.unwrap();
    let rows = c
        .query(
            "SELECT message_id::text, element FROM elements
             ORDER BY (element ->> 'partition')::int, (element ->> 'offset')::bigint",
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let e: serde_json::Value = r.get(1);
            let picked: serde_json::Map<String, serde_json::Value> = fields
                .iter()
                .map(|f| ((*f).to_owned(), e[*f].clone()))
                .collect();
            (r.get(0), serde_json::Value::Object(picked))
        })
        .collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_can_come_from_keys_or_positions() {
    let records = [
        raw(0, &[], Some("customer-1"), Some("{\"v\": 1}")),
        raw(0, &[], Some("customer-2"), Some("{\"v\": 2}")),
        raw(0, &[], Some("customer-1"), Some("{\"v\": 3}")), // the same key: a duplicate
        raw(0, &[], None, Some("{\"v\": 4}")),               // no key: missing_id by key
    ];
    let world = sql_scenario("sql_id_from_key", "sql-id-sources")
        .core_tables(ELEMENTS)
        .records(records)
        .build()
        .await;
    let topic = world.topic.clone();
    let sql = elements_sql(&temp_dir("id-sources"));

    let (url, pool) = world.db();
    let by_key = ["--id-from", "key", "--id-format", "any"];
    let run = apply(&world, &url, "key", &sql, &by_key).await;
    assert_eq!(summary(&run), [4, 2, 1, 1, 0, 0]);
    let fields = ["id", "key", "value"];
    assert_eq!(
        elements(&pool, &fields).await,
        [
            (
                id_key(&topic, b"customer-1").to_string(),
                json!({"id": "customer-1", "key": "customer-1", "value": {"v": 1}})
            ),
            (
                id_key(&topic, b"customer-2").to_string(),
                json!({"id": "customer-2", "key": "customer-2", "value": {"v": 2}})
            ),
        ]
    );
    let replay = apply(&world, &url, "key-replay", &sql, &by_key).await;
    assert_eq!(summary(&replay), [4, 0, 3, 1, 0, 0]);

    let (url, pool) = world.database("sql_id_from_position").await;
    let by_position = ["--id-from", "position"];
    let run = apply(&world, &url, "pos", &sql, &by_position).await;
    assert_eq!(
        summary(&run),
        [4, 4, 0, 0, 0, 0],
        "every record once, resends too"
    );
    let got = elements(&pool, &["id", "offset"]).await;
    let expected: Vec<(String, serde_json::Value)> = (0..4)
        .map(|o| {
            let key = position_key(&topic, 0, o).to_string();
            (key, json!({"id": null, "offset": o}))
        })
        .collect();
    assert_eq!(got, expected);
    let replay = apply(&world, &url, "pos-replay", &sql, &by_position).await;
    assert_eq!(summary(&replay), [4, 0, 4, 0, 0, 0]);
    assert_eq!(count(&pool, "SELECT count(*) FROM elements").await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_can_be_text_or_bytes() {
    let id = |n: u32| uuid(n).into_bytes();
    let value = |n: u32, v: Option<&[u8]>| RawRecord {
        partition: 0,
        key: None,
        value: v.map(<[u8]>::to_vec),
        headers: vec![(b"id".to_vec(), Some(id(n)))],
        timestamp_ms: None,
    };
    let records = [
        value(1, Some("héllo \"world\"\n".as_bytes())),
        value(2, Some(b"")),
        value(3, Some(b"\xff\xfe")),
        value(4, Some(b"a\0b")),
        value(5, None),
        value(6, Some(b"{\"json\": true}")),
    ];
    let world = sql_scenario("sql_value_text", "sql-value-formats")
        .core_tables(ELEMENTS)
        .records(records)
        .build()
        .await;
    let sql = elements_sql(&temp_dir("value-formats"));
    let fields = ["tombstone", "value"];

    let (url, pool) = world.db();
    let text = ["--value-format", "text"];
    let run = apply(&world, &url, "text", &sql, &text).await;
    assert_eq!(summary(&run), [6, 4, 0, 2, 0, 0]);
    assert_eq!(
        elements(&pool, &fields).await,
        [
            (
                uuid(1),
                json!({"tombstone": false, "value": "héllo \"world\"\n"})
            ),
            (uuid(2), json!({"tombstone": false, "value": ""})),
            (uuid(5), json!({"tombstone": true, "value": null})),
            (
                uuid(6),
                json!({"tombstone": false, "value": "{\"json\": true}"})
            ),
        ]
    );
    let letters: Vec<(i64, String)> = dead_letters(&pool)
        .await
        .into_iter()
        .map(|(_, o, _, reason, _)| (o, reason))
        .collect();
    let invalid = |o| (o, "invalid_payload".to_owned());
    assert_eq!(letters, [invalid(2), invalid(3)], "not UTF-8, and a NUL");

    let (url, pool) = world.database("sql_value_bytes").await;
    let bytes = ["--value-format", "bytes"];
    let run = apply(&world, &url, "bytes", &sql, &bytes).await;
    assert_eq!(summary(&run), [6, 6, 0, 0, 0, 0]);
    let hex = |h: &str| json!({"tombstone": false, "value": {"hex": h}});
    assert_eq!(
        elements(&pool, &fields).await,
        [
            (uuid(1), hex("68c3a96c6c6f2022776f726c64220a")),
            (uuid(2), hex("")),
            (uuid(3), hex("fffe")),
            (uuid(4), hex("610062")),
            (uuid(5), json!({"tombstone": true, "value": null})),
            (uuid(6), hex("7b226a736f6e223a20747275657d")),
        ]
    );
    let replay = apply(&world, &url, "bytes-replay", &sql, &bytes).await;
    assert_eq!(summary(&replay), [6, 0, 6, 0, 0, 0]);
}

//! Typed input (`-- batch-inbox: $N = …` declarations): fields taken from each value in Rust and
//! passed as typed arrays; a missing, null, out-of-range or wrongly typed field is dead-lettered
//! as `invalid_payload` naming it, before the statement runs, in both modes; tombstones pass with
//! their value fields NULL; Kafka Connect's envelope is unwrapped.

use super::*;

const NOT_BIGINT: &str = "not an integer from -9223372036854775808 to 9223372036854775807 (bigint)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balances_from_typed_fields_refuse_each_bad_field_by_name() {
    let entry = |id, value: &str| record(0, id, None, value);
    let mut tombstone = record(0, 9, None, "");
    tombstone.value = None;
    let records = vec![
        entry(1, r#"{"account_id": 1, "amount": 5}"#),    // 0
        entry(1, r#"{"account_id": 1, "amount": 5}"#),    // 1: copy
        entry(2, r#"{"account_id": 2, "amount": "5"}"#),  // 2: a string
        entry(3, r#"{"amount": 3}"#),                     // 3: no account
        entry(4, r#"{"account_id": 1, "amount": null}"#), // 4: null
        entry(5, r#"{"account_id": 1, "amount": 9223372036854775808}"#), // 5: too big
        entry(6, r#"{"account_id": 1, "amount": 1.5}"#),  // 6: not an integer
        entry(7, r#"{"account_id": 2, "amount": -7}"#),   // 7
        entry(8, r#"{"account_id": 3, "amount": 9223372036854775807}"#), // 8: the largest
        tombstone,                                        // 9
        entry(7, r#"{"account_id": 2, "amount": -7}"#),   // 10: copy, a later batch
        entry(11, r#"{"account_id": 1, "amount": 2, "note": [1]}"#), // 11
    ];
    let world = sql_scenario("sql_typed_balances", "sql-typed-balances")
        .core_tables(&ddl("balances.ddl.sql"))
        .records(records)
        .build()
        .await;
    let invalid = |offset, id, detail: &str| letter(offset, id, "invalid_payload", detail);
    let expected_letters = vec![
        invalid(2, 2, "field value /amount is \"5\", not a number (bigint)"),
        invalid(3, 3, "field value /account_id is missing"),
        invalid(4, 4, "field value /amount is null"),
        invalid(
            5,
            5,
            &format!("field value /amount is 9223372036854775808, {NOT_BIGINT}"),
        ),
        invalid(6, 6, &format!("field value /amount is 1.5, {NOT_BIGINT}")),
        letter(
            9,
            9,
            "empty_payload",
            "the record has no value (a tombstone)",
        ),
    ];
    let sql = example("balances_upsert.sql");
    for ((url, pool), mode) in both_modes(&world, "sql_typed_balances_pm").await {
        let flags = [
            "--mode",
            mode,
            "--batch-size",
            "4",
            "--tombstones",
            "dead-letter",
        ];
        let run = apply(&world, &url, mode, &sql, &flags).await;
        // records, new, duplicates, invalid, rejected, poisoned
        assert_eq!(summary(&run), [12, 9, 2, 1, 5, 0], "{mode}");
        assert_eq!(dead_letters(&pool).await, expected_letters, "{mode}");
        let c = pool.get().await.unwrap();
        let rows = c
            .query("SELECT account_id, amount FROM balances ORDER BY 1", &[])
            .await
            .unwrap();
        let balances: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(balances, [(1, 7), (2, -7), (3, i64::MAX)], "{mode}");
        assert_eq!(
            count(&pool, "SELECT count(*) FROM inbox").await,
            9,
            "the tombstone is not in it"
        );
    }
}

/// Accounts kept by key from Connect envelopes: optional fields, a header, a timestamp, and
/// tombstones that delete.
const ACCOUNTS_DDL: &str = "CREATE TABLE accounts (id text PRIMARY KEY, name text NOT NULL,
    tier smallint, seen timestamptz, kind text)";

const ACCOUNTS_SQL: &str = r#"-- batch-inbox: envelope = connect
-- batch-inbox: $1 = key
-- batch-inbox: $2 = tombstone
-- batch-inbox: $3 = value /name
-- batch-inbox: $4 = value /tier optional
-- batch-inbox: $5 = value /seen optional
-- batch-inbox: $6 = header kind optional
-- batch-inbox: $7 = offset
WITH m AS (
    SELECT DISTINCT ON (id) *
    FROM unnest($1::text[], $2::bool[], $3::text[], $4::smallint[], $5::timestamptz[],
                $6::text[], $7::bigint[]) AS m(id, gone, name, tier, seen, kind, o)
    ORDER BY id, o DESC
),
gone AS (DELETE FROM accounts a USING m WHERE m.gone AND a.id = m.id)
INSERT INTO accounts AS a (id, name, tier, seen, kind)
SELECT id, name, tier, seen, kind FROM m WHERE NOT gone ORDER BY id
ON CONFLICT (id) DO UPDATE
SET name = excluded.name, tier = excluded.tier, seen = excluded.seen, kind = excluded.kind"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_envelopes_with_optional_fields_headers_and_tombstones() {
    let env =
        |payload: &str| format!(r#"{{"schema": {{"type": "struct"}}, "payload": {payload}}}"#);
    let account =
        |id, key: Option<&str>, value: &str| record(0, id, key.map(str::as_bytes), &env(value));
    let mut a = account(
        1,
        Some("a"),
        r#"{"name": "Ann", "tier": 2, "seen": "2026-12-02T10:00:00Z"}"#,
    );
    a.headers.push((b"kind".to_vec(), Some(b"x".to_vec())));
    let mut gone = record(0, 4, Some(b"a"), "");
    gone.value = None;
    let mut g = account(
        9,
        Some("g"),
        r#"{"name": "G", "tier": 1, "seen": "2026-01-01T00:00:00+01:00"}"#,
    );
    g.headers.push((b"kind".to_vec(), Some(b"vip".to_vec())));
    let records = vec![
        a,                                                                   // 0
        account(2, Some("b"), r#"{"name": "Bob"}"#),                         // 1
        record(0, 3, Some(b"c"), r#"{"name": "C"}"#),                        // 2: no envelope
        gone,                                                                // 3: deletes a
        account(5, Some("d"), r#"{"name": null}"#),                          // 4: null name
        account(6, Some("e"), r#"{"name": "E", "tier": 70000}"#),            // 5: tier too big
        account(7, None, r#"{"name": "F"}"#),                                // 6: no key
        account(8, Some("b"), r#"{"name": "Bob2", "seen": 1764669600000}"#), // 7
        g,                                                                   // 8
    ];
    let world = sql_scenario("sql_typed_accounts", "sql-typed-accounts")
        .core_tables(ACCOUNTS_DDL)
        .records(records)
        .build()
        .await;
    let dir = std::env::temp_dir().join(format!("typed-sql-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sql = dir.join("accounts.sql");
    std::fs::write(&sql, ACCOUNTS_SQL).unwrap();
    let invalid = |offset, id, detail: &str| letter(offset, id, "invalid_payload", detail);
    let expected_letters = vec![
        invalid(
            2,
            3,
            "the value is not a Kafka Connect JSON envelope: it has no \"payload\" field",
        ),
        invalid(4, 5, "field value /name is null"),
        invalid(
            5,
            6,
            "field value /tier is 70000, not an integer from -32768 to 32767 (smallint)",
        ),
        invalid(6, 7, "field key is missing"),
    ];
    for ((url, pool), mode) in both_modes(&world, "sql_typed_accounts_pm").await {
        let flags = ["--mode", mode, "--batch-size", "3"];
        let run = apply(&world, &url, mode, &sql, &flags).await;
        assert_eq!(summary(&run), [9, 9, 0, 0, 4, 0], "{mode}");
        assert_eq!(dead_letters(&pool).await, expected_letters, "{mode}");
        let c = pool.get().await.unwrap();
        let rows = c
            .query(
                "SELECT id, name, tier, (extract(epoch FROM seen) * 1000)::bigint, kind
                 FROM accounts ORDER BY 1",
                &[],
            )
            .await
            .unwrap();
        type Row = (String, String, Option<i16>, Option<i64>, Option<String>);
        let accounts: Vec<Row> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect();
        let expected: Vec<Row> = vec![
            (
                "b".into(),
                "Bob2".into(),
                None,
                Some(1_764_669_600_000),
                None,
            ),
            (
                "g".into(),
                "G".into(),
                Some(1),
                Some(1_767_222_000_000),
                Some("vip".into()),
            ),
        ];
        assert_eq!(accounts, expected, "{mode}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

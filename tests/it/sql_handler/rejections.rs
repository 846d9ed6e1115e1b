//! Rejection rows the statement returns: a bad reason never stops the partition, a row naming
//! an id outside the batch stalls it until the statement is fixed.

use super::*;

/// A statement whose result names a message by the value's `reason` (or names a foreign id
/// when the value says `foreign`).
const BY_VALUE: &str = "\
SELECT CASE WHEN m.value ? 'foreign' THEN '00000000-0000-4000-8000-999999999999'
            ELSE m.id::text END AS message_id,
       m.value ->> 'reason' AS reason
FROM jsonb_to_recordset($1) AS m(id uuid, value jsonb)
WHERE m.value ? 'reason' OR m.value ? 'foreign'";

/// The same statement, fixed: it names only its own messages, under valid names.
const BY_VALUE_FIXED: &str = "\
SELECT m.id::text AS message_id, m.value ->> 'reason' AS reason
FROM jsonb_to_recordset($1) AS m(id uuid, value jsonb)
WHERE m.value ->> 'reason' = 'too_big'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejection_rows_with_a_bad_reason_never_stop_the_partition() {
    let records = [
        record(0, 1, None, r#"{"reason": "too_big"}"#), // 0: a valid name
        record(0, 2, None, r#"{"reason": "Not Valid"}"#), // 1: not a name
        record(0, 3, None, "{}"),                       // 2
        record(0, 5, None, r#"{"reason": null}"#),      // 3: NULL
        record(0, 6, None, "{}"),                       // 4
    ];
    let world = sql_scenario("sql_bad_rejections", "sql-bad-rejections")
        .records(records)
        .build()
        .await;
    let (url, pool) = world.db();
    let file = std::env::temp_dir().join(format!("by-value-{}.sql", std::process::id()));
    std::fs::write(&file, BY_VALUE).unwrap();
    let run = apply(&world, &url, "g", &file, &["--batch-size", "6"]).await;
    let _ = std::fs::remove_file(&file);
    assert_eq!(summary(&run), [5, 5, 0, 0, 3, 0]);
    let letters = dead_letters(&pool).await;
    let reasons: Vec<(i64, &str)> = letters.iter().map(|l| (l.1, l.3.as_str())).collect();
    assert_eq!(
        reasons,
        [(0, "too_big"), (1, "handler_error"), (3, "handler_error")]
    );
    assert_eq!(letters[0].4, "rejected by the SQL statement");
    assert!(
        letters[1].4.contains("reason \"Not Valid\""),
        "{}",
        letters[1].4
    );
    assert!(letters[2].4.contains("reason NULL"), "{}", letters[2].4);
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 5);
}

/// A rejection row that names an id outside the statement's input is the statement's bug, not a
/// message's: the partition stalls (nothing committed, nothing dead-lettered) until a fixed
/// statement runs, which then applies every message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_row_naming_a_foreign_id_stalls_until_the_statement_is_fixed() {
    let records = [
        record(0, 1, None, r#"{"reason": "too_big"}"#),
        record(0, 2, None, r#"{"foreign": 1}"#),
        record(0, 3, None, "{}"),
    ];
    let world = sql_scenario("sql_foreign_rejection", "sql-foreign-rejection")
        .records(records)
        .build()
        .await;
    let (url, pool) = world.db();
    let dir = std::env::temp_dir();
    let (bad_file, fixed_file) = (
        dir.join(format!("by-value-foreign-{}.sql", std::process::id())),
        dir.join(format!("by-value-fixed-{}.sql", std::process::id())),
    );
    std::fs::write(&bad_file, BY_VALUE).unwrap();
    std::fs::write(&fixed_file, BY_VALUE_FIXED).unwrap();

    let bad = [
        "--apply-sql",
        bad_file.to_str().unwrap(),
        "--batch-size",
        "6",
    ];
    let running = world.spawn("g", &bad);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while !running.stderr_lines().iter().any(|l| {
        l.contains("partition stalled, not the message's fault")
            && l.contains("not one of its input's messages")
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "no stall: {:#?}",
            running.stderr_lines()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped = running.stop().await;
    assert_eq!(stopped.code, Some(0), "{}", stopped.stderr);
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM dead_letters").await, 0);

    let run = apply(&world, &url, "g", &fixed_file, &["--batch-size", "6"]).await;
    let _ = std::fs::remove_file(&bad_file);
    let _ = std::fs::remove_file(&fixed_file);
    assert_eq!(summary(&run), [3, 3, 0, 0, 1, 0]);
    let letters = dead_letters(&pool).await;
    let reasons: Vec<(i64, &str)> = letters.iter().map(|l| (l.1, l.3.as_str())).collect();
    assert_eq!(reasons, [(0, "too_big")]);
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 3);
}

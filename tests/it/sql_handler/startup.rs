//! Start-up: a statement that cannot run ends the process before anything is consumed; the
//! handler is a setting like any other.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_that_cannot_run_ends_the_process_before_anything_is_consumed() {
    let world = sql_scenario("sql_bad_statement", "sql-bad-statement")
        .records([record(0, 1, None, "{}")])
        .build()
        .await;
    let (url, pool) = world.db();
    let dir = std::env::temp_dir().join(format!("bad-sql-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text, reason) in [
        (
            "nope.sql",
            "INSERT INTO nope SELECT * FROM jsonb_array_elements($1)",
            "the statement does not prepare: ERROR: relation \"nope\" does not exist",
        ),
        (
            "two.sql",
            "SELECT $1::jsonb, $2::int",
            "the statement must take exactly one parameter, $1 of type jsonb; it takes \
             $1 jsonb, $2 int4",
        ),
        (
            "text.sql",
            "SELECT $1::text",
            "exactly one parameter, $1 of type jsonb; it takes $1 text",
        ),
        ("none.sql", "SELECT 1", "$1 of type jsonb; it takes none"),
        ("empty.sql", "", "the file holds no SQL statement"),
        (
            "comment.sql",
            "-- nothing\n/* here */\n",
            "holds no SQL statement",
        ),
        (
            "two_statements.sql",
            "SELECT $1::jsonb; SELECT 2",
            "ERROR: cannot insert multiple commands into a prepared statement",
        ),
        (
            "undeclared.sql",
            "-- batch-inbox: $1 = message_id\nSELECT $1::uuid[], $2::bigint[]",
            "the statement takes $2, which is not declared",
        ),
        (
            "numeric.sql",
            "-- batch-inbox: $1 = value /amount\nSELECT unnest($1::numeric[])",
            "$1 (value /amount) is of type numeric[]; it must be one of smallint[]",
        ),
        (
            "scalar.sql",
            "-- batch-inbox: $1 = offset\nSELECT $1::bigint",
            "$1 (offset) is of type int8; it must be one of bigint[] (cast it: $1::bigint[])",
        ),
        (
            "typo.sql",
            "-- batch-inbox: $1 = value amount\nSELECT unnest($1::bigint[])",
            "line 1: unexpected \"amount\" after `value`",
        ),
        (
            "shape.sql",
            "SELECT 1 AS message_id, 'x' AS reason FROM jsonb_array_elements($1)",
            "the result's column message_id is int4; rejections need uuid or text",
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let run = apply(&world, &url, "g", &path, &[]).await;
        assert_eq!(run.code, Some(1), "{name}: {}", run.stderr);
        let line = format!("error: --apply-sql {}: ", path.display());
        let last = run.stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with(&line) && last.contains(reason),
            "{name}: {}",
            run.stderr
        );
    }
    // A file that reads the value as JSON, with values that are not.
    let pointer = dir.join("pointer.sql");
    std::fs::write(
        &pointer,
        "-- batch-inbox: $1 = value /a\nSELECT unnest($1::bigint[])",
    )
    .unwrap();
    let run = apply(&world, &url, "g", &pointer, &["--value-format", "text"]).await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("which needs --value-format json, not text"),
        "{}",
        run.stderr
    );
    let missing = dir.join("missing.sql");
    let run = apply(&world, &url, "g", &missing, &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot read the file"),
        "{}",
        run.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
    // Nothing consumed: no inbox row, no dead letter, no stored offset.
    let consumed = "SELECT (SELECT count(*) FROM inbox) + (SELECT count(*) FROM dead_letters)
                    + (SELECT count(*) FROM consumer_offsets)";
    assert_eq!(count(&pool, consumed).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_is_a_setting_like_any_other() {
    let sql = example("customers.sql");
    let sql = sql.to_str().unwrap();
    let shown = Running::spawn(
        &["run", "--apply-sql", sql, "--print-config"],
        &[("BATCH_INBOX_HANDLER", "sql")],
    )
    .wait(Duration::from_secs(30))
    .await;
    assert_eq!(shown.code, Some(0), "{}", shown.stderr);
    assert!(
        shown.stdout.contains("handler = \"sql\"  # env")
            && shown
                .stdout
                .contains(&format!("apply-sql = {sql:?}  # flag")),
        "{}",
        shown.stdout
    );
    for (args, needle) in [
        (vec!["run", "--handler", "sql"], "--apply-sql"),
        (vec!["run", "--apply-sql", sql], "add --handler sql"),
    ] {
        let refused = Running::spawn(&args, &[])
            .wait(Duration::from_secs(30))
            .await;
        assert_eq!(refused.code, Some(2), "{args:?}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(needle),
            "{args:?}: {}",
            refused.stderr
        );
    }
}

//! Retention of a plain inbox: batched cleanup, the dedup-window guard, the background task, the
//! `cleanup` command.

use crate::common;
use crate::common::retention as retention_helpers;
use crate::common::scenario::Scenario;
use std::time::{Duration, Instant, SystemTime};

use batch_inbox::retention::{self, Layout};
use batch_inbox::Mode;
use common::*;
use retention_helpers::*;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_exactly_the_expired_rows_and_keeps_the_rest() {
    let (_, pool) = fresh_db("cleanup_exact").await;
    install_uuid7(&pool).await;
    insert_rows(&pool, 2_345, 8 * DAY, false).await;
    insert_rows(&pool, 1_000, 7 * DAY + Duration::from_secs(60), true).await;
    insert_rows(&pool, 700, 7 * DAY - Duration::from_secs(600), false).await;
    insert_rows(&pool, 300, Duration::ZERO, true).await;
    let c = pool.get().await.unwrap();
    c.batch_execute(
        "CREATE TABLE young AS SELECT * FROM inbox WHERE processed_at > now() - interval '7 days'",
    )
    .await
    .unwrap();

    let stop = CancellationToken::new();
    let report = retention::cleanup(&pool, &settings(7 * DAY, 500), SystemTime::now(), &stop)
        .await
        .unwrap();
    assert_eq!(report.layout, Layout::Plain);
    assert_eq!(report.rows_deleted, 3_345);
    assert_eq!(
        report.delete_statements, 7,
        "3,345 rows at most 500 per statement"
    );
    assert_eq!(count(&pool, "inbox", "true").await, 1_000);
    let missing = count(
        &pool,
        "young y",
        "NOT EXISTS (SELECT 1 FROM inbox i WHERE i.message_id = y.message_id)",
    )
    .await;
    assert_eq!(missing, 0, "every row younger than the retention is kept");

    let again = retention::cleanup(&pool, &settings(7 * DAY, 500), SystemTime::now(), &stop)
        .await
        .unwrap();
    assert_eq!((again.rows_deleted, again.delete_statements), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_processed_at_index_leaves_uuidv7_rows_to_the_primary_key() {
    let (_, pool) = fresh_db("cleanup_keyrange").await;
    install_uuid7(&pool).await;
    let c = pool.get().await.unwrap();
    let definition: String = c
        .query_one(
            "SELECT pg_get_indexdef('inbox_processed_at'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        definition.ends_with("WHERE ((get_byte(uuid_send(message_id), 6) >> 4) <> 7)"),
        "UUIDv7 rows pay no processed_at index entry: {definition}"
    );
    // Expired: created and processed 8 days ago. Kept: a UUIDv7 created 8 days ago but
    // processed now (late), and a UUIDv4 whose random bits sort below the cutoff's UUIDs.
    c.batch_execute(
        "INSERT INTO inbox (message_id, topic, partition, \"offset\", processed_at)
         SELECT uuid7_at(now() - interval '8 days'), 'seed', 0, g, now() - interval '8 days'
         FROM generate_series(1, 1200) g;
         INSERT INTO inbox (message_id, topic, partition, \"offset\")
         SELECT uuid7_at(now() - interval '8 days'), 'late', 0, g FROM generate_series(1, 30) g;
         INSERT INTO inbox (message_id, topic, partition, \"offset\")
         VALUES ('00000000-0000-4000-8000-000000000001', 'v4', 0, 1);",
    )
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let report = retention::cleanup(&pool, &settings(7 * DAY, 500), SystemTime::now(), &stop)
        .await
        .unwrap();
    assert_eq!((report.rows_deleted, report.delete_statements), (1_200, 3));
    assert_eq!(count(&pool, "inbox", "topic = 'seed'").await, 0);
    assert_eq!(count(&pool, "inbox", "topic <> 'seed'").await, 31);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_inside_the_window_is_still_caught_after_cleanup() {
    let now = SystemTime::now();
    let inside = v7_at(now - DAY).to_string();
    let expired_v4 = uuid(1);
    let world = Scenario::new("window_dup")
        .mock()
        .entry(0, &inside, 5, 10)
        .entry(0, &expired_v4, 5, 1)
        .build()
        .await;
    let pool = &world.pool;
    let mut cfg = config(world.settings("g1"), Mode::Batched, 100);
    cfg.dedup_window = Some(7 * DAY);
    let first = world.run_library(cfg.clone()).await;
    assert_eq!(first.new, 2);
    let c = pool.get().await.unwrap();
    c.execute(
        "UPDATE inbox SET processed_at = now() - interval '8 days' WHERE message_id = $1",
        &[&uuid::Uuid::parse_str(&expired_v4).unwrap()],
    )
    .await
    .unwrap();

    let stop = CancellationToken::new();
    let report = retention::cleanup(pool, &settings(7 * DAY, 100), SystemTime::now(), &stop)
        .await
        .unwrap();
    assert_eq!(report.rows_deleted, 1);

    // The whole topic again, to a group without offsets: the copy inside the window is skipped.
    world.kafka().send_entry(0, &inside, 5, 10).await;
    cfg.kafka = world.settings("g2");
    let again = world.run_library(cfg).await;
    assert_eq!(again.records, 3);
    assert_eq!(
        again.duplicates, 2,
        "both copies of the id inside the window"
    );
    assert_eq!(
        again.new, 1,
        "the UUIDv4 id whose row expired cannot be recognised"
    );
    assert_eq!(tables(pool).await.balances, vec![(5, 12)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_dead_letters_an_old_v7_id() {
    let now = SystemTime::now();
    let old = v7_at(now - 8 * DAY).to_string();
    let world = Scenario::new("guard")
        .mock()
        .entry(0, &v7_at(now).to_string(), 9, 4)
        .entry(0, &old, 9, 100)
        .entry(0, &uuid(7), 9, 3)
        .entry(0, &v7_at(now - 6 * DAY).to_string(), 9, 2)
        .build()
        .await;
    let mut cfg = config(world.settings("g"), Mode::Batched, 100);
    cfg.dedup_window = Some(7 * DAY);
    let stats = world.run_library(cfg).await;
    assert_eq!((stats.records, stats.new, stats.invalid), (4, 3, 1));

    let t = tables(&world.pool).await;
    assert_eq!(t.balances, vec![(9, 9)], "the old id is not applied");
    assert_eq!(t.inbox.len(), 3);
    assert_eq!(
        t.dead_letters,
        vec![(0, 1, Some(old), "outside_dedup_window".to_owned())]
    );

    // Per-message mode has the same guard.
    let (_, pool) = world.database("guard_pm").await;
    let mut cfg = config(world.settings("g-pm"), Mode::PerMessage, 100);
    cfg.dedup_window = Some(7 * DAY);
    let stats = drain(cfg, &pool).await;
    assert_eq!((stats.new, stats.invalid), (3, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_task_removes_expired_rows_while_it_runs() {
    let (_, pool) = fresh_db("background").await;
    insert_rows(&pool, 1_200, 3 * DAY, false).await;
    insert_rows(&pool, 50, Duration::ZERO, false).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(retention::maintain(
        pool.clone(),
        settings(2 * DAY, 100),
        true,
        Duration::from_millis(50),
        stop.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&pool, "inbox", "true").await != 50 {
        assert!(
            Instant::now() < deadline,
            "expired rows still there after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the task stops when cancelled")
        .unwrap();
    assert_eq!(
        count(&pool, "inbox", "processed_at > now() - interval '1 hour'").await,
        50
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleanup_command_reports_rows_removed_and_time_taken() {
    let (url, pool) = fresh_db("cleanup_cli").await;
    insert_rows(&pool, 42, 10 * DAY, false).await;
    insert_rows(&pool, 8, DAY, false).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_batch-inbox"))
        .args(["cleanup", "--retention", "7d", "--database-url", &url])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("removed 42 rows in 1 statements"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with(" s"), "{stdout}");
    assert_eq!(count(&pool, "inbox", "true").await, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_topic_retention_is_reported_as_unknown_without_blocking_the_start() {
    // librdkafka's mock cluster does not implement DescribeConfigs.
    let kafka = Kafka::new("topic-retention", 1);
    let started = Instant::now();
    let outcome = retention::topic::warn_if_topic_outlives(&kafka.settings("g"), 7 * DAY).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    match outcome {
        retention::topic::TopicRetention::Unknown(why) => {
            assert!(why.contains("DescribeConfigs"), "{why}")
        }
        other => panic!("the mock cluster answered DescribeConfigs: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_a_retention_guards_the_window_and_prepares_partitions_before_consuming() {
    let now = SystemTime::now();
    let old = v7_at(now - 8 * DAY).to_string();
    let world = Scenario::new("run_retention")
        .mock()
        .entry(0, &old, 2, 50)
        .entry(0, &v7_at(now).to_string(), 2, 6)
        .args(&["--retention", "7d", "--partitions-ahead", "2"])
        .env("RUST_LOG", "info,batch_inbox=debug,rdkafka=warn")
        .build()
        .await;
    let pool = &world.pool;
    let mut c = pool.get().await.unwrap();
    let today = batch_inbox::internals::days::day_of_millis(
        batch_inbox::internals::days::unix_millis(SystemTime::now()),
    );
    retention::convert(&mut c, today - 5, 0).await.unwrap();
    let out = world.run_binary().await;
    let stderr = &out.stderr;
    assert!(out.code == Some(0), "{stderr}");
    assert!(
        stderr.contains("cannot read the topic's retention.ms"),
        "{stderr}"
    );
    let days = batch_inbox::internals::retention::partition::partition_days(&c)
        .await
        .unwrap();
    assert_eq!(days, vec![today - 5, today, today + 1, today + 2]);
    let t = tables(pool).await;
    assert_eq!(t.balances, vec![(2, 6)]);
    assert_eq!(
        t.dead_letters,
        vec![(0, 0, Some(old), "outside_dedup_window".to_owned())]
    );
}

/// Keys derived from ids that are not UUIDs, and from positions, carry no time: they expire by
/// `processed_at`, like UUIDv4 ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_keys_expire_by_the_time_they_were_processed() {
    use batch_inbox::key::{id_key, position_key};
    let (_, pool) = fresh_db("cleanup_derived").await;
    let c = pool.get().await.unwrap();
    let old = [id_key("t", b"order-1"), position_key("t", 0, 1)];
    let young = [id_key("t", b"order-2"), position_key("t", 0, 2)];
    for (keys, age) in [(old, "8 days"), (young, "1 day")] {
        for (i, key) in keys.iter().enumerate() {
            c.execute(
                "INSERT INTO inbox (message_id, topic, partition, \"offset\", processed_at)
                 VALUES ($1, 't', 0, $2, now() - $3::text::interval)",
                &[key, &(i as i64), &age],
            )
            .await
            .unwrap();
        }
    }
    let stop = CancellationToken::new();
    let report = retention::cleanup(&pool, &settings(7 * DAY, 500), SystemTime::now(), &stop)
        .await
        .unwrap();
    assert_eq!(report.rows_deleted, 2);
    let kept: Vec<uuid::Uuid> = c
        .query("SELECT message_id FROM inbox ORDER BY message_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut expected = young.to_vec();
    expected.sort();
    assert_eq!(kept, expected);
}

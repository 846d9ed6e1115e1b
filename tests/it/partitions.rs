//! The partitioned inbox: daily partitions by UUIDv7 time, prepared ahead, dropped whole when
//! expired, a default partition for everything else, and the conversion from a plain inbox.

use crate::common;
use crate::common::retention as retention_helpers;
use std::time::{Duration, Instant, SystemTime};

use batch_inbox::internals::days::{day_bounds, day_of_millis, partition_name, unix_millis};
use batch_inbox::internals::retention::partition::{self, DdlOutcome};
use batch_inbox::retention::{self, Conversion, Layout};
use batch_inbox::Mode;
use common::*;
use deadpool_postgres::Pool;
use retention_helpers::*;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn today() -> i64 {
    day_of_millis(unix_millis(SystemTime::now()))
}

async fn partitioned_db(name: &str) -> (String, Pool) {
    let (url, pool) = fresh_db(name).await;
    install_uuid7(&pool).await;
    let mut c = pool.get().await.unwrap();
    let conversion = retention::convert(&mut c, today(), 3).await.unwrap();
    assert_eq!(
        conversion,
        Some(Conversion {
            rows: 0,
            partitions: 4
        })
    );
    (url, pool)
}

/// A UUIDv4-shaped id whose first 48 bits fall on `day`.
fn v4_on_day(day: i64) -> Uuid {
    let mut bytes = *day_bounds(day).0.as_bytes();
    bytes[6] = 0x40;
    bytes[8] = 0x80;
    bytes[15] = 1;
    Uuid::from_bytes(bytes)
}

async fn insert_id(pool: &Pool, id: Uuid, processed_ago: Duration) {
    let c = pool.get().await.unwrap();
    c.execute(
        "INSERT INTO inbox (message_id, topic, partition, \"offset\", processed_at)
         VALUES ($1, 'seed', 0, 0, now() - make_interval(secs => $2))",
        &[&id, &processed_ago.as_secs_f64()],
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_created_ahead_and_dropped_when_expired() {
    let (_, pool) = partitioned_db("parts_expire").await;
    let today = today();
    let mut c = pool.get().await.unwrap();
    let days = partition::partition_days(&c).await.unwrap();
    assert_eq!(days, (today..=today + 3).collect::<Vec<_>>());
    for day in [today - 10, today - 8, today - 7, today - 6] {
        let created = partition::create_day(&mut c, day, Duration::from_millis(100));
        assert_eq!(created.await.unwrap(), DdlOutcome::Done(0));
    }
    for age in [10, 8, 6, 0] {
        insert_rows(&pool, 100, age * DAY, true).await;
    }
    // A UUIDv4 whose random bits fell on an old day, processed just now: it keeps its retention.
    let young_v4 = v4_on_day(today - 10);
    insert_id(&pool, young_v4, Duration::ZERO).await;
    let in_old_day = count(&pool, &partition_name(today - 10), "true").await;
    assert_eq!(in_old_day, 101);

    let stop = CancellationToken::new();
    let now = SystemTime::now();
    let report = retention::cleanup(&pool, &settings(7 * DAY, 1_000), now, &stop)
        .await
        .unwrap();
    assert_eq!(report.layout, Layout::Partitioned);
    assert_eq!(
        report.partitions_dropped,
        vec![partition_name(today - 10), partition_name(today - 8)]
    );
    assert_eq!(report.rows_kept_from_dropped, 1);
    assert!(report.partitions_created.is_empty() && report.postponed.is_empty());
    assert_eq!((report.rows_deleted, report.default_rows), (0, Some(1)));
    assert_eq!(count(&pool, "inbox", "true").await, 201);
    assert_eq!(
        count(
            &pool,
            "inbox_default",
            &format!("message_id = '{young_v4}'")
        )
        .await,
        1
    );

    // Two days later: two more days prepared ahead, two more expired.
    let later = now + 2 * DAY;
    let report = retention::cleanup(&pool, &settings(7 * DAY, 1_000), later, &stop)
        .await
        .unwrap();
    assert_eq!(
        report.partitions_created,
        vec![partition_name(today + 4), partition_name(today + 5)]
    );
    assert_eq!(
        report.partitions_dropped,
        vec![partition_name(today - 7), partition_name(today - 6)]
    );
    assert_eq!(count(&pool, "inbox", "true").await, 101);
    let days = partition::partition_days(&c).await.unwrap();
    assert_eq!(days, (today..=today + 5).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_partition_catches_ids_outside_the_prepared_days_and_is_reported() {
    let (_, pool) = partitioned_db("parts_default").await;
    let now = SystemTime::now();
    insert_id(&pool, v7_at(now + 100 * DAY), Duration::ZERO).await;
    insert_id(&pool, v7_at(now + 100 * DAY), Duration::ZERO).await;
    insert_id(&pool, v7_at(now - 400 * DAY), Duration::ZERO).await;
    insert_rows(&pool, 3, Duration::ZERO, false).await;
    insert_rows(&pool, 2, 30 * DAY, false).await;
    assert_eq!(count(&pool, "inbox_default", "true").await, 8);

    let stop = CancellationToken::new();
    let report = retention::cleanup(&pool, &settings(7 * DAY, 1_000), now, &stop)
        .await
        .unwrap();
    assert_eq!(
        report.rows_deleted, 2,
        "expired rows of the default partition"
    );
    assert_eq!(report.default_rows, Some(6));
    assert!(
        report.to_string().contains("default partition 6 rows"),
        "{report}"
    );

    // Preparing the day of the two future ids moves them out of the default partition.
    let mut c = pool.get().await.unwrap();
    let day = today() + 100;
    let created = partition::create_day(&mut c, day, Duration::from_millis(100));
    assert_eq!(created.await.unwrap(), DdlOutcome::Done(2));
    assert_eq!(count(&pool, &partition_name(day), "true").await, 2);
    assert_eq!(count(&pool, "inbox_default", "true").await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_a_plain_inbox_to_partitions_keeps_every_row() {
    let (_, pool) = fresh_db("parts_convert").await;
    install_uuid7(&pool).await;
    for (n, age) in [(300, 0), (200, 1), (200, 5), (100, 30), (50, 400)] {
        insert_rows(&pool, n, age * DAY, true).await;
    }
    insert_rows(&pool, 250, 2 * DAY, false).await;
    let known = v7_at(SystemTime::now() - 5 * DAY);
    insert_id(&pool, known, 5 * DAY).await;
    let before = fingerprint(&pool).await;
    assert_eq!(before.0, 1_101);

    let mut c = pool.get().await.unwrap();
    let conversion = retention::convert(&mut c, today(), 3).await.unwrap();
    assert_eq!(
        conversion,
        Some(Conversion {
            rows: 1_101,
            partitions: 30 + 1 + 3
        })
    );
    assert_eq!(partition::layout(&c).await.unwrap(), Layout::Partitioned);
    assert_eq!(fingerprint(&pool).await, before, "every row, every column");
    assert_eq!(
        count(&pool, "inbox_default", "true").await,
        300,
        "UUIDv4 and 400-day-old ids"
    );
    assert_eq!(retention::convert(&mut c, today(), 3).await.unwrap(), None);

    // The processor dedups against the converted inbox.
    let kafka = Kafka::new("parts-convert", 1);
    kafka.send_entry(0, &known.to_string(), 1, 5).await;
    kafka
        .send_entry(0, &v7_at(SystemTime::now()).to_string(), 1, 7)
        .await;
    let stats = drain(config(kafka.settings("g"), Mode::Batched, 100), &pool).await;
    assert_eq!((stats.new, stats.duplicates), (1, 1));
    assert_eq!(tables(&pool).await.balances, vec![(1, 7)]);
    assert_eq!(count(&pool, "inbox", "true").await, 1_102);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_drop_gives_up_on_a_busy_lock_instead_of_queueing_the_processor() {
    let (url, pool) = partitioned_db("parts_busy").await;
    let today = today();
    let mut c = pool.get().await.unwrap();
    let created = partition::create_day(&mut c, today - 9, Duration::from_millis(100));
    assert_eq!(created.await.unwrap(), DdlOutcome::Done(0));
    insert_rows(&pool, 10, 9 * DAY, true).await;

    // A processor transaction in flight: it holds a lock on the inbox until it commits.
    let other = batch_inbox::db::connect(&url, 1).await.unwrap();
    let mut busy = other.get().await.unwrap();
    let tx = busy.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO inbox (message_id, topic, partition, \"offset\") VALUES ($1, 't', 0, 1)",
        &[&v7_at(SystemTime::now())],
    )
    .await
    .unwrap();

    let stop = CancellationToken::new();
    let started = Instant::now();
    let report = retention::cleanup(&pool, &settings(7 * DAY, 1_000), SystemTime::now(), &stop)
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(report.postponed, vec![partition_name(today - 9)]);
    assert!(report.partitions_dropped.is_empty());
    tx.commit().await.unwrap();

    let report = retention::cleanup(&pool, &settings(7 * DAY, 1_000), SystemTime::now(), &stop)
        .await
        .unwrap();
    assert_eq!(report.partitions_dropped, vec![partition_name(today - 9)]);
    assert_eq!(count(&pool, "inbox", "true").await, 1);
}

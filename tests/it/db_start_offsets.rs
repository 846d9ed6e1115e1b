//! A member that starts a partition from the database's offset (ahead of Kafka's committed one)
//! stores that offset for Kafka's next commit, so Kafka's lag reaches 0 without a new record.

use crate::common;
use crate::common::group;
use batch_inbox::Mode;
use common::*;
use group::{db_offsets, inbox_rows, wait_for, Member, OffsetReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_commits_the_database_start_offset_of_a_partition_at_its_end() {
    let (_url, pool) = fresh_db("db_start_offsets").await;
    let kafka = Kafka::new("db-start", 1);
    for n in 0..5u32 {
        kafka.send_entry(0, &uuid(n), 1, 10).await;
    }
    // The database says records 0-4 are committed; Kafka has no committed offset for the group.
    pool.get()
        .await
        .unwrap()
        .execute(
            "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, updated_at) \
             VALUES ('g', $1, 0, 5, now())",
            &[&kafka.topic],
        )
        .await
        .unwrap();
    let reader = OffsetReader::new(&kafka.brokers, "g", &kafka.topic, 1);
    assert_eq!(reader.ends(), vec![5]);
    assert_eq!(reader.committed(), Some(vec![-1]));

    let mut cfg = config(kafka.settings("g"), Mode::Batched, 10);
    cfg.exit_on_eof = false;
    cfg.kafka
        .overrides
        .push(("auto.commit.interval.ms".to_owned(), "200".to_owned()));
    let member = Member::start(cfg, &pool);
    wait_for("Kafka's committed offset to reach the end", 30, || async {
        reader.committed() == Some(vec![5])
    })
    .await;
    let replays_avoided = member.stats.snapshot().replays_avoided;
    member.stop().await;

    assert_eq!(replays_avoided, 5, "the member started from the database");
    assert_eq!(inbox_rows(&pool).await, 0, "no record was read again");
    assert_eq!(db_offsets(&pool, "g", 1).await, vec![5]);
    assert_eq!(reader.committed(), Some(vec![5]));
}

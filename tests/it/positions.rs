//! The database is the system of record, positions included: after the database goes back in
//! time (a restore from a backup, a failover to an asynchronous replica that lagged), the
//! processor resumes from the positions it holds, never from Kafka's committed offsets, and a
//! running member notices the database going back under it. Each test takes a consistent copy
//! of the database's tables mid-run and puts it back later (what a restore does to them: the
//! inbox, the business table, the dead letters and the positions go back together), then checks
//! the exact balances, inbox rows and positions.

use crate::common;
use crate::common::child;
use crate::common::group;
use batch_inbox::Mode;
use common::*;
use deadpool_postgres::Pool;
use group::{db_offsets, inbox_rows, wait_for, Member, OffsetReader};

const TABLES: [&str; 4] = ["inbox", "balances", "dead_letters", "consumer_offsets"];

/// A consistent copy of the processor's tables (one transaction), as a backup holds them.
async fn backup(pool: &Pool) {
    let mut c = pool.get().await.unwrap();
    let tx = c.transaction().await.unwrap();
    for t in TABLES {
        let sql = format!(
            "DROP TABLE IF EXISTS backup_{t}; CREATE TABLE backup_{t} AS SELECT * FROM {t}"
        );
        tx.batch_execute(&sql).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// Puts the copy back in one transaction: the database went back in time.
async fn restore(pool: &Pool) {
    let mut c = pool.get().await.unwrap();
    let tx = c.transaction().await.unwrap();
    for t in TABLES {
        let sql = format!("DELETE FROM {t}; INSERT INTO {t} SELECT * FROM backup_{t}");
        tx.batch_execute(&sql).await.unwrap();
    }
    tx.commit().await.unwrap();
}

async fn balance(pool: &Pool, account: i64) -> i64 {
    let c = pool.get().await.unwrap();
    c.query_opt(
        "SELECT amount FROM balances WHERE account_id = $1",
        &[&account],
    )
    .await
    .unwrap()
    .map_or(0, |r| r.get(0))
}

/// Sends entries `from..to` of 10 each to `account` on `partition`.
async fn send(kafka: &Kafka, partition: i32, account: i64, from: u32, to: u32) {
    for n in from..to {
        kafka.send_entry(partition, &uuid(n), account, 10).await;
    }
}

/// A one-partition topic of its own on the real broker (`KAFKA_BROKERS`), with its group: for
/// what librdkafka's mock cluster cannot do (delete records, describe topics).
struct OnKafka {
    broker: crate::common::broker::Broker,
    topic: String,
    group: String,
    producer: rdkafka::producer::FutureProducer,
}

impl OnKafka {
    async fn new(name: &str) -> Self {
        use crate::common::broker::Broker;
        let broker = Broker::start();
        let topic = broker.topic(name);
        batch_inbox_tools::produce::ensure_topic(&broker.addr, &topic, 1)
            .await
            .unwrap();
        let producer = batch_inbox_tools::produce::producer(&broker.addr, &[]).unwrap();
        let group = Broker::group(&topic, "g");
        OnKafka {
            broker,
            topic,
            group,
            producer,
        }
    }

    /// Sends entries `from..to` of 10 each to account 1.
    async fn send(&self, from: u32, to: u32) {
        let entries: Vec<_> = (from..to)
            .map(|n| batch_inbox_tools::generate::Record {
                key: "1".to_owned(),
                value: Some(br#"{"account_id":1,"amount":10}"#.to_vec()),
                id: Some(uuid(n)),
            })
            .collect();
        batch_inbox_tools::produce::send_all(&self.producer, &self.topic, entries)
            .await
            .unwrap();
    }

    /// The processor's Kafka settings for the topic and group, ends reported.
    fn settings(&self) -> batch_inbox::KafkaSettings {
        let mut kafka =
            batch_inbox::KafkaSettings::new(&self.broker.addr, &self.topic, &self.group);
        kafka.partition_eof = true;
        kafka
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_database_behind_kafka_is_read_again_from_its_position() {
    let (_url, pool) = fresh_db("positions_restore").await;
    let kafka = Kafka::new("positions-restore", 1);
    send(&kafka, 0, 1, 0, 10).await;
    drain(config(kafka.settings("g"), Mode::Batched, 4), &pool).await;
    backup(&pool).await;
    send(&kafka, 0, 1, 10, 30).await;
    drain(config(kafka.settings("g"), Mode::Batched, 4), &pool).await;
    assert_eq!(balance(&pool, 1).await, 300);
    let reader = OffsetReader::new(&kafka.brokers, "g", &kafka.topic, 1);
    assert_eq!(reader.committed(), Some(vec![30]));

    restore(&pool).await;
    assert_eq!(balance(&pool, 1).await, 100);
    let again = drain(config(kafka.settings("g"), Mode::Batched, 4), &pool).await;

    assert_eq!(
        again.new, 20,
        "the 20 records the database lost were applied again"
    );
    assert_eq!(again.duplicates, 0);
    assert_eq!(again.positions_rewound, 1);
    assert_eq!(
        again.records_rewound, 20,
        "the gap: Kafka's 30 against the database's 10"
    );
    assert_eq!(balance(&pool, 1).await, 300);
    assert_eq!(inbox_rows(&pool).await, 30);
    assert_eq!(db_offsets(&pool, "g", 1).await, vec![30]);
    wait_for("Kafka's committed offset to follow", 30, || async {
        reader.committed() == Some(vec![30])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_without_a_position_of_a_known_topic_starts_at_its_beginning() {
    let (_url, pool) = fresh_db("positions_no_row").await;
    let kafka = Kafka::new("positions-no-row", 2);
    send(&kafka, 0, 1, 0, 5).await;
    drain(config(kafka.settings("g"), Mode::Batched, 4), &pool).await;
    // The backup is from before partition 1's first commit.
    backup(&pool).await;
    send(&kafka, 1, 2, 5, 12).await;
    drain(config(kafka.settings("g"), Mode::Batched, 4), &pool).await;
    assert_eq!(db_offsets(&pool, "g", 2).await, vec![5, 7]);

    restore(&pool).await;
    assert_eq!(db_offsets(&pool, "g", 2).await, vec![5, -1]);
    let again = drain(config(kafka.settings("g"), Mode::Batched, 4), &pool).await;

    assert_eq!(
        again.new, 7,
        "partition 1 was read from its beginning: {again:?}"
    );
    assert_eq!(again.duplicates, 0);
    assert_eq!(again.positions_rewound, 1);
    assert_eq!((balance(&pool, 1).await, balance(&pool, 2).await), (50, 70));
    assert_eq!(inbox_rows(&pool).await, 12);
    assert_eq!(db_offsets(&pool, "g", 2).await, vec![5, 7]);
}

/// A running member of group `g` on a one-partition topic of its own (database and topic named
/// after `name`): records `0..backed_up` applied, the database backed up ([`backup`]), then
/// records up to `applied` applied. The caller restores the backup under the member.
async fn applied_after_a_backup(name: &str, backed_up: u32, applied: u32) -> (Pool, Kafka, Member) {
    let (_url, pool) = fresh_db(name).await;
    let kafka = Kafka::new(&name.replace('_', "-"), 1);
    let mut cfg = config(kafka.settings("g"), Mode::Batched, 4);
    cfg.exit_on_eof = false;
    let member = Member::start(cfg, &pool);
    for (from, to) in [(0, backed_up), (backed_up, applied)] {
        send(&kafka, 0, 1, from, to).await;
        wait_for(&format!("{to} applied"), 60, || async {
            db_offsets(&pool, "g", 1).await == vec![i64::from(to)]
        })
        .await;
        if from == 0 {
            backup(&pool).await;
        }
    }
    (pool, kafka, member)
}

/// A member that keeps running while its database goes back in time: the next batch's offset
/// write finds another position than the one it committed, rolls back, and the partition moves
/// to the database's position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_member_notices_the_database_going_back_at_its_next_batch() {
    let (pool, kafka, member) = applied_after_a_backup("positions_running", 10, 20).await;

    restore(&pool).await;
    send(&kafka, 0, 1, 20, 25).await;
    wait_for("every record applied", 60, || async {
        db_offsets(&pool, "g", 1).await == vec![25] && inbox_rows(&pool).await == 25
    })
    .await;
    let stats = member.stats.snapshot();
    member.stop().await;

    assert_eq!(balance(&pool, 1).await, 250);
    assert_eq!(inbox_rows(&pool).await, 25);
    assert_eq!(stats.positions_rewound, 1, "{stats:?}");
    assert_eq!(
        stats.records_rewound, 10,
        "this member had committed 20, the database 10"
    );
    assert_eq!(
        stats.new, 35,
        "records 10-19 applied twice: once before, once after the restore"
    );
}

/// The same, with no new record after the database went back: the idle partition compares its
/// position with the database's and reads the lost records again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_member_notices_the_database_going_back() {
    let (pool, _kafka, member) = applied_after_a_backup("positions_idle", 6, 15).await;

    restore(&pool).await;
    assert_eq!(inbox_rows(&pool).await, 6);
    wait_for("the lost records applied again", 60, || async {
        db_offsets(&pool, "g", 1).await == vec![15] && inbox_rows(&pool).await == 15
    })
    .await;
    let stats = member.stats.snapshot();
    member.stop().await;

    assert_eq!(balance(&pool, 1).await, 150);
    assert_eq!(stats.positions_rewound, 1, "{stats:?}");
    assert_eq!(stats.records_rewound, 9);
}

async fn offset_changes(pool: &Pool) -> Vec<(i32, Option<i64>, i64, String, String)> {
    let c = pool.get().await.unwrap();
    c.query(
        "SELECT partition, from_offset, to_offset, target, reason FROM consumer_offset_changes \
         ORDER BY changed_at, partition",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
    .collect()
}

/// `positions set`: an operator's rewind goes through the database (recorded), a dry run moves
/// nothing, an offset outside the log is refused, and the processor follows the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_moves_a_group_through_the_database() {
    let (url, pool) = fresh_db("positions_set").await;
    let kafka = Kafka::new("positions-set", 2);
    send(&kafka, 0, 1, 0, 10).await;
    send(&kafka, 1, 2, 10, 16).await;
    drain(config(kafka.settings("g"), Mode::Batched, 4), &pool).await;
    assert_eq!(db_offsets(&pool, "g", 2).await, vec![10, 6]);
    let set = |extra: &[&str]| {
        let mut args = vec!["positions", "set", "--database-url", &url];
        args.extend([
            "--brokers",
            &kafka.brokers,
            "--topic",
            &kafka.topic,
            "--group",
            "g",
        ]);
        args.extend(extra);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            child::Running::spawn(&refs, &[])
                .wait(std::time::Duration::from_secs(60))
                .await
        }
    };

    let dry = set(&[
        "--partition",
        "0",
        "--to-offset",
        "4",
        "--reason",
        "t",
        "--dry-run",
    ])
    .await;
    assert_eq!(dry.code, Some(0), "{}", dry.stderr);
    assert!(dry.stdout.contains("dry run"), "{}", dry.stdout);
    assert_eq!(db_offsets(&pool, "g", 2).await, vec![10, 6]);

    let outside = set(&["--partition", "0", "--to-offset", "99", "--reason", "t"]).await;
    assert_eq!(outside.code, Some(1), "{}", outside.stderr);
    assert!(
        outside.stderr.contains("outside partition 0's log"),
        "{}",
        outside.stderr
    );

    let rewind = set(&[
        "--partition",
        "0",
        "--to-offset",
        "4",
        "--reason",
        "replay 4-9",
    ])
    .await;
    assert_eq!(rewind.code, Some(0), "{}", rewind.stderr);
    assert_eq!(db_offsets(&pool, "g", 2).await, vec![4, 6]);
    let changes = offset_changes(&pool).await;
    let want = (
        0,
        Some(10),
        4,
        "--to-offset 4".to_owned(),
        "replay 4-9".to_owned(),
    );
    assert_eq!(changes, vec![want]);

    let again = drain(config(kafka.settings("g"), Mode::Batched, 4), &pool).await;
    assert_eq!((again.new, again.duplicates), (0, 6), "{again:?}");
    assert_eq!(
        (balance(&pool, 1).await, balance(&pool, 2).await),
        (100, 60)
    );
    assert_eq!(db_offsets(&pool, "g", 2).await, vec![10, 6]);

    let earliest = set(&["--to-earliest", "--reason", "all again"]).await;
    assert_eq!(earliest.code, Some(0), "{}", earliest.stderr);
    assert_eq!(db_offsets(&pool, "g", 2).await, vec![0, 0]);
    assert_eq!(offset_changes(&pool).await.len(), 3);
}

/// A database position before the partition's log start (Kafka deleted those records before
/// they were applied: a restore from a backup older than the topic's retention) is never
/// skipped in silence: the partition stalls visibly until an operator accepts the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_deleted_before_the_database_position_stall_the_partition_until_accepted() {
    use crate::common::http;
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use std::sync::Arc;
    use std::time::Duration;

    let k = OnKafka::new("positions-lost").await;
    k.send(0, 10).await;
    let (broker, topic, group) = (&k.broker, k.topic.as_str(), k.group.as_str());
    let (url, pool) = fresh_db("positions_lost").await;
    let settings = || k.settings();
    drain(config(settings(), Mode::Batched, 4), &pool).await;
    // The database goes back to position 2; Kafka deletes the records before offset 5.
    let c = pool.get().await.unwrap();
    c.execute("UPDATE consumer_offsets SET next_offset = 2", &[])
        .await
        .unwrap();
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &broker.addr)
        .create()
        .unwrap();
    let mut before = rdkafka::TopicPartitionList::new();
    before
        .add_partition_offset(topic, 0, rdkafka::Offset::Offset(5))
        .unwrap();
    admin
        .delete_records(&before, &AdminOptions::new())
        .await
        .unwrap();

    let stats = Arc::new(batch_inbox::Stats::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let addr = common::listener(&url, &pool, &stats, &stop).await;
    let mut cfg = config(settings(), Mode::Batched, 4);
    cfg.exit_on_eof = false;
    let run = tokio::spawn(batch_inbox::run_with_stats(
        cfg,
        pool.clone(),
        Arc::new(batch_inbox::ledger::Ledger),
        stats.clone(),
        stop.clone().cancelled_owned(),
    ));
    let body = http::poll(
        Duration::from_secs(60),
        "/readyz to say records lost",
        || async {
            let (status, body) = http::get(addr, "/readyz").await;
            (status == 503 && body.contains("records lost")).then_some(body)
        },
    )
    .await;
    assert!(body.contains(&format!("{topic}/0")), "{body}");
    // The stalled gauge says what the partition waits on: an operator's acceptance of the loss.
    let (_, metrics) = http::get(addr, "/metrics").await;
    let series =
        format!("batch_inbox_stalled{{topic=\"{topic}\",partition=\"0\",reason=\"records_lost\"}}");
    assert_eq!(
        http::samples(&metrics).get(&series),
        Some(&1.0),
        "{metrics}"
    );
    assert_eq!(
        db_offsets(&pool, group, 1).await,
        vec![2],
        "nothing skipped"
    );
    stop.cancel();
    run.await.unwrap().unwrap();

    let accepted = child::Running::spawn(
        &[
            "positions",
            "set",
            "--database-url",
            &url,
            "--brokers",
            &broker.addr,
            "--topic",
            topic,
            "--group",
            group,
            "--to-earliest",
            "--reason",
            "records 2-4 lost",
        ],
        &[],
    )
    .wait(Duration::from_secs(60))
    .await;
    assert_eq!(accepted.code, Some(0), "{}", accepted.stderr);
    assert_eq!(db_offsets(&pool, group, 1).await, vec![5]);
    let after = drain(config(settings(), Mode::Batched, 4), &pool).await;
    assert_eq!((after.new, after.duplicates), (0, 5), "{after:?}");
    assert_eq!(db_offsets(&pool, group, 1).await, vec![10]);
}

/// librdkafka's mock cluster (the demo's broker) names no controller of its own, so it cannot
/// describe topics: that is told from its metadata at once. Before, the topic-id check waited for
/// two 10 s DescribeTopics timeouts (at start and in the rebalance callback) and said each in a
/// WARN line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_cannot_describe_topics_costs_no_timeout_and_no_warning() {
    let (url, pool) = fresh_db("positions_no_describe").await;
    let kafka = Kafka::new("positions-no-describe", 1);
    send(&kafka, 0, 1, 0, 5).await;
    let run = child::Running::spawn(
        &[
            "run",
            "--database-url",
            &url,
            "--brokers",
            &kafka.brokers,
            "--topic",
            &kafka.topic,
            "--group",
            "g",
            "--exit-on-eof",
            "--log-interval",
            "0",
        ],
        &[("RUST_LOG", "warn")],
    )
    .wait(std::time::Duration::from_secs(60))
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        !run.stderr.contains("topics' ids") && !run.stderr.contains("DescribeTopics"),
        "{}",
        run.stderr
    );
    assert_eq!(balance(&pool, 1).await, 50);
    assert_eq!(db_offsets(&pool, "g", 1).await, vec![5]);
}

/// The topic-id check fails closed: when the database's record of the topics' ids cannot be
/// read (here the processor's role may not read `consumer_topics`), the stored positions may
/// belong to a deleted topic of the same name, so nothing is consumed: the check is retried,
/// then the processor stops with `PositionsUnread`, having applied and committed nothing. Needs
/// a broker that describes topics (Apache Kafka; librdkafka's mock cluster does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_ids_that_cannot_be_read_consume_nothing() {
    use std::time::Duration;

    let k = OnKafka::new("positions-ids-unread").await;
    k.send(0, 5).await;
    let (broker, topic, group) = (&k.broker, k.topic.as_str(), k.group.as_str());
    let (url, pool) = fresh_db("positions_ids_unread").await;
    let settings = || k.settings();
    drain(config(settings(), Mode::Batched, 4), &pool).await;
    k.send(5, 10).await;
    let role = "bi_positions_ids";
    let c = pool.get().await.unwrap();
    c.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
         GRANT ALL ON ALL TABLES IN SCHEMA public TO {role};
         GRANT ALL ON SCHEMA public TO {role};
         REVOKE SELECT ON consumer_topics FROM {role}"
    ))
    .await
    .unwrap();
    let role_url = url.replacen("postgres@", &format!("{role}@"), 1);
    let role_pool = batch_inbox::db::connect(&role_url, 4).await.unwrap();
    init_tracing();
    let run = batch_inbox::run(
        config(settings(), Mode::Batched, 4),
        role_pool,
        std::sync::Arc::new(batch_inbox::ledger::Ledger),
        std::future::pending(),
    );
    let result = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the processor stops within 120 s");

    match result {
        Err(batch_inbox::RunError::PositionsUnread { detail }) => {
            assert!(detail.contains("topics' ids"), "{detail}")
        }
        other => panic!("expected PositionsUnread, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        inbox_rows(&pool).await,
        5,
        "nothing applied after the first drain"
    );
    assert_eq!(balance(&pool, 1).await, 50);
    assert_eq!(db_offsets(&pool, group, 1).await, vec![5]);
    let reader = OffsetReader::new(&broker.addr, group, topic, 1);
    assert_eq!(reader.committed(), Some(vec![5]));
}

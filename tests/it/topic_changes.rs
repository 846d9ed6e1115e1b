//! The topic changing under a running processor, through the binary and a real broker: a topic
//! deleted and re-created (its stored offsets belong to the old topic id: the processor stops
//! with both ids and the reset, consumes nothing of the new topic, and after the reset applies
//! it whole), and a partition added (consumed, offsets right).

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

use crate::common::broker::Broker;
use crate::common::child::Running;
use crate::common::group::wait_for;
use crate::common::raw_producer::{RawProducer, RawRecord};
use crate::common::{fresh_db, tables, uuid};

/// A ledger entry: id `uuid(id)`, `amount` to account 1, keyless.
fn entry(partition: i32, id: u32, amount: i64) -> RawRecord {
    RawRecord {
        partition,
        key: None,
        value: Some(format!("{{\"account_id\": 1, \"amount\": {amount}}}").into_bytes()),
        headers: vec![(b"id".to_vec(), Some(uuid(id).into_bytes()))],
        timestamp_ms: None,
    }
}

fn send(broker: &Broker, topic: &str, records: &[RawRecord]) {
    let mut producer = RawProducer::new(&broker.addr, topic);
    for r in records {
        producer.send(r);
    }
    producer.flush();
}

fn admin(broker: &Broker) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", &broker.addr)
        .create()
        .expect("an admin client")
}

/// `run` of the ledger over `topic`, metadata refreshed every second (so that a topic change is
/// seen within a second, not librdkafka's default five minutes).
fn spawn(url: &str, broker: &Broker, topic: &str, extra: &[&str]) -> Running {
    let group = Broker::group(topic, "g");
    let mut args = vec!["run", "--database-url", url, "--brokers", &broker.addr];
    args.extend(["--topic", topic, "--group", &group, "--log-interval", "0"]);
    args.extend(["-X", "topic.metadata.refresh.interval.ms=1000"]);
    args.extend(extra);
    Running::spawn(&args, &[("RUST_LOG", "warn")])
}

async fn balance(pool: &deadpool_postgres::Pool) -> Vec<(i64, i64)> {
    tables(pool).await.balances
}

async fn recorded_topic_id(pool: &deadpool_postgres::Pool, topic: &str) -> Option<uuid::Uuid> {
    let c = pool.get().await.unwrap();
    c.query_opt(
        "SELECT topic_id FROM consumer_topics WHERE topic = $1",
        &[&topic],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

/// Topic `topic_<name>` with one partition and `n` entries of 10 to account 1, the processor
/// running on database `topic_<name>` until they are applied.
async fn running_on_one_partition(
    name: &str,
    n: u32,
) -> (Broker, String, String, deadpool_postgres::Pool, Running) {
    let broker = Broker::start();
    let topic = broker.topic(name);
    batch_inbox_tools::produce::ensure_topic(&broker.addr, &topic, 1)
        .await
        .unwrap();
    send(
        &broker,
        &topic,
        &(1..=n).map(|i| entry(0, i, 10)).collect::<Vec<_>>(),
    );
    let (url, pool) = fresh_db(&format!("topic_{name}")).await;
    let running = spawn(&url, &broker, &topic, &[]);
    let want = [(1, 10 * i64::from(n))];
    wait_for("the first records applied", 60, || async {
        balance(&pool).await == want
    })
    .await;
    (broker, topic, url, pool, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_recreated_while_running_stops_the_processor_with_both_ids_and_nothing_skipped() {
    let (broker, topic, url, pool, running) = running_on_one_partition("recreated", 5).await;
    let first_id = recorded_topic_id(&pool, &topic).await.expect("id recorded");

    // Deleted, then created again under the same name with three new records.
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let deleted = admin(&broker)
        .delete_topics(&[&topic], &opts)
        .await
        .unwrap();
    assert!(deleted.iter().all(Result::is_ok), "{deleted:?}");
    let mut created = false;
    for _ in 0..100 {
        let new =
            rdkafka::admin::NewTopic::new(&topic, 1, rdkafka::admin::TopicReplication::Fixed(-1));
        let r = admin(&broker).create_topics([&new], &opts).await.unwrap();
        if r.iter().all(Result::is_ok) {
            created = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // still being deleted
    }
    assert!(created, "the topic is created again");
    send(
        &broker,
        &topic,
        &(6..=8).map(|n| entry(0, n, 1)).collect::<Vec<_>>(),
    );

    // Running: the partition's position went back to the new log's start; nothing of it applied.
    let stopped = running.wait(Duration::from_secs(120)).await;
    assert_eq!(stopped.code, Some(1), "{}", stopped.stderr);
    let last = stopped.stderr.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            "error: {topic}/0 went back from offset 5 to 0: the topic was deleted and \
             re-created, or its log truncated; nothing of it was applied. Start again: a \
             re-created topic is then reported with its ids"
        )
    );
    assert_eq!(
        balance(&pool).await,
        [(1, 50)],
        "nothing of the new topic applied"
    );

    // At start, before anything is consumed: both ids, and the reset.
    let again = spawn(&url, &broker, &topic, &["--exit-on-eof"])
        .wait(Duration::from_secs(120))
        .await;
    assert_eq!(again.code, Some(1), "{}\n{}", again.stdout, again.stderr);
    let last = again.stderr.lines().last().unwrap_or_default().to_owned();
    assert!(
        last.contains(&format!("topic {topic} was deleted and re-created"))
            && last.contains(&format!("belong to topic id {first_id}"))
            && last.contains("DELETE FROM consumer_offsets WHERE group_id = "),
        "{}",
        again.stderr
    );
    assert_eq!(balance(&pool).await, [(1, 50)]);

    // The reset the line gives, then the new topic whole.
    let reset = last
        .split_once("keyed by the old topic's positions (")
        .and_then(|(_, rest)| rest.split_once("), set the group's positions of the new topic"))
        .map(|(sql, _)| sql.to_owned())
        .expect("the reset SQL");
    pool.get()
        .await
        .unwrap()
        .batch_execute(&reset)
        .await
        .unwrap();
    // And the group's positions of the new topic, in the database (the line says so too):
    // Kafka's committed offset still holds the old log's 5, and is not where a start comes from.
    let group = Broker::group(&topic, "g");
    let set = Running::spawn(
        &[
            "positions",
            "set",
            "--database-url",
            &url,
            "--brokers",
            &broker.addr,
            "--topic",
            &topic,
            "--group",
            &group,
            "--to-earliest",
            "--reason",
            "topic re-created",
        ],
        &[],
    )
    .wait(Duration::from_secs(60))
    .await;
    assert_eq!(set.code, Some(0), "{}", set.stderr);
    let done = spawn(&url, &broker, &topic, &["--exit-on-eof"])
        .wait(Duration::from_secs(120))
        .await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert_eq!(balance(&pool).await, [(1, 53)]);
    let second_id = recorded_topic_id(&pool, &topic)
        .await
        .expect("new id recorded");
    assert_ne!(second_id, first_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_added_while_running_is_consumed() {
    let (broker, topic, _, pool, running) = running_on_one_partition("grown", 3).await;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let grown = admin(&broker)
        .create_partitions(&[NewPartitions::new(&topic, 2)], &opts)
        .await
        .unwrap();
    assert!(grown.iter().all(Result::is_ok), "{grown:?}");
    send(
        &broker,
        &topic,
        &[entry(1, 4, 5), entry(1, 5, 5), entry(0, 6, 1)],
    );
    wait_for("the new partition applied", 90, || async {
        balance(&pool).await == [(1, 41)]
    })
    .await;
    let stopped = running.stop().await;
    assert_eq!(stopped.code, Some(0), "{}", stopped.stderr);
    let c = pool.get().await.unwrap();
    let offsets: Vec<(i32, i64)> = c
        .query(
            "SELECT partition, next_offset FROM consumer_offsets WHERE topic = $1 ORDER BY 1",
            &[&topic],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(offsets, [(0, 4), (1, 2)]);
    assert_eq!(tables(&pool).await.inbox.len(), 6);
}

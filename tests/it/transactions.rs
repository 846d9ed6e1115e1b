//! A topic written by a transactional producer (what Debezium and Kafka Connect sources with
//! exactly-once support, Kafka Streams and Flink write): each transaction ends in a commit or
//! abort marker, a control record that carries no message. No aborted record is applied, and
//! `--exit-on-eof` exits: the position stored, in the database and in Kafka, is the consumer's,
//! past the markers, so the partition's end is reached and Kafka's lag is 0.

use std::time::Duration;

use crate::common;
use crate::common::broker::Broker;
use crate::common::group;
use batch_inbox::Mode;
use common::scenario::Scenario;
use common::*;
use group::{db_offsets, inbox_rows, wait_for, OffsetReader};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;

const TIMEOUT: Duration = Duration::from_secs(30);

fn transactional_producer(broker: &Broker, id: &str) -> ThreadedProducer<DefaultProducerContext> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &broker.addr)
        .set("transactional.id", id)
        .create()
        .expect("a transactional producer");
    producer.init_transactions(TIMEOUT).unwrap();
    producer
}

/// One transaction of `n` entries of `amount` to account 1, ids from `first`, spread over
/// `partitions`; committed or aborted.
fn transaction(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    partitions: i32,
    (first, n): (u32, u32),
    amount: i64,
    commit: bool,
) {
    producer.begin_transaction().unwrap();
    for i in first..first + n {
        let id = uuid(i);
        let value = format!(r#"{{"account_id":1,"amount":{amount}}}"#);
        let headers = OwnedHeaders::new().insert(Header {
            key: "id",
            value: Some(id.as_bytes()),
        });
        let record = BaseRecord::<str, str>::to(topic)
            .partition(i as i32 % partitions)
            .payload(&value)
            .headers(headers);
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    // Written to the log before the abort, which would otherwise purge what is not sent yet.
    producer.flush(TIMEOUT).unwrap();
    match commit {
        true => producer.commit_transaction(TIMEOUT).unwrap(),
        false => producer.abort_transaction(TIMEOUT).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_topic_drains_with_no_aborted_record_applied_and_lag_zero() {
    let world = Scenario::new("transactions").partitions(2).build().await;
    let (broker, topic) = (world.broker(), world.topic.clone());
    let producer = transactional_producer(broker, &format!("{topic}-tx"));
    transaction(&producer, &topic, 2, (0, 40), 10, true);
    transaction(&producer, &topic, 2, (40, 10), 1000, false);
    transaction(&producer, &topic, 2, (50, 20), 10, true);
    transaction(&producer, &topic, 2, (70, 6), 1000, false);
    drop(producer);

    let (pool, group) = (world.pool.clone(), world.group("g"));
    let stats = drain(config(world.settings("g"), Mode::Batched, 16), &pool).await;

    assert_eq!(stats.new, 60, "the committed records only: {stats:?}");
    assert_eq!(tables(&pool).await.balances, vec![(1, 600)]);
    assert_eq!(inbox_rows(&pool).await, 60);
    let reader = OffsetReader::new(&broker.addr, &group, &topic, 2);
    let ends = reader.ends();
    // Each partition holds 30 committed and 8 aborted records and four markers.
    assert_eq!(ends, vec![42, 42]);
    assert_eq!(
        db_offsets(&pool, &group, 2).await,
        ends,
        "past the last marker"
    );
    wait_for("Kafka's lag to reach 0", 30, || async {
        reader.committed() == Some(ends.clone())
    })
    .await;
}

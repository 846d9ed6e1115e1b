//! The broker contract the exactly-once guarantee rests on: a fetch at offset N returns the
//! record at N first, also when N lies inside a record batch (a consumer resuming from a
//! committed offset, or re-fetching after a rebalance, asks for such offsets).
//!
//! librdkafka's mock cluster keeps it (the first test), and so must the broker the end-to-end,
//! load and chaos runs use (the second: Apache Kafka from `scripts/test.sh`, or
//! `KAFKA_BROKERS=host:port` for any other broker). tansu 0.6 did not: a fetch that started inside a batch
//! returned the next batch, so the rest of the containing batch was skipped, and the chaos run
//! lost records. This test is how a broker is checked before it is trusted with the chaos run.

use crate::common::broker;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

/// Produces records `first`..`first + 10` (the payload is the number) to partition 0 of
/// `topic` in one batch (one linger window).
async fn produce_one_batch(brokers: &str, topic: &str, first: i64) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "500")
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let sends = (first..first + 10).map(|i| {
        let value = i.to_string();
        let producer = producer.clone();
        async move {
            let record: FutureRecord<'_, str, str> =
                FutureRecord::to(topic).partition(0).payload(&value);
            producer
                .send(record, Duration::from_secs(10))
                .await
                .map_err(|(e, _)| e)
                .unwrap()
        }
    });
    let delivered = futures::future::join_all(sends).await;
    assert_eq!(delivered.len(), 10);
}

/// The offset and payload of the first record a fetch from `start` returns.
fn first_from(brokers: &str, topic: &str, start: i64) -> (i64, String) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "broker-fetch-check")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(start))
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut errors = Vec::new();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let payload = String::from_utf8_lossy(m.payload().unwrap_or_default());
                return (m.offset(), payload.into_owned());
            }
            Some(Err(e)) => errors.push(e.to_string()),
            None => {}
        }
    }
    panic!("no record fetched from offset {start}; errors: {errors:?}");
}

/// Two batches of 10; fetches at 0 (a batch's first offset) and at 5 (inside the first batch).
async fn check_fetch_inside_a_batch(brokers: &str, topic: &str) {
    produce_one_batch(brokers, topic, 0).await;
    produce_one_batch(brokers, topic, 10).await;

    assert_eq!(first_from(brokers, topic, 0), (0, "0".to_owned()));
    assert_eq!(
        first_from(brokers, topic, 5),
        (5, "5".to_owned()),
        "a fetch at offset 5 must return the record at offset 5 first (a broker that returns the \
         next batch, (10, \"10\"), skips 5-9)"
    );
}

#[tokio::test]
async fn the_mock_cluster_fetches_from_inside_a_batch() {
    let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
    cluster.create_topic("fetch-mid-batch", 1, 1).unwrap();
    check_fetch_inside_a_batch(&cluster.bootstrap_servers(), "fetch-mid-batch").await;
}

#[tokio::test]
async fn the_broker_fetches_from_inside_a_batch() {
    let broker = broker::Broker::start();
    let topic = broker.topic("fetch-mid-batch");
    batch_inbox_tools::produce::ensure_topic(&broker.addr, &topic, 1)
        .await
        .unwrap();
    check_fetch_inside_a_batch(&broker.addr, &topic).await;
}

//! Writes records to a topic in the wire contract: header `id`, key = account id, JSON value.
//! Each record's Kafka timestamp is its send time, so latency is measured from there.

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::generate::Record;
use batch_inbox::internal::error::KafkaClientError;

/// Most records awaiting delivery at once.
const IN_FLIGHT: usize = 20_000;

/// Creates `topic` with `partitions` partitions unless it exists.
pub async fn ensure_topic(brokers: &str, topic: &str, partitions: i32) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics([&new], &opts).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code)),
        }
    }
    Ok(())
}

/// A producer that keeps per-partition order across retries (idempotent), with `overrides`
/// (librdkafka properties) applied last.
pub fn producer(
    brokers: &str,
    overrides: &[(String, String)],
) -> Result<FutureProducer, KafkaClientError> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("message.timeout.ms", "60000");
    for (k, v) in overrides {
        c.set(k, v);
    }
    c.create().map_err(|e| KafkaClientError::new(e, overrides))
}

/// Sends every record and waits for each delivery; returns how many were delivered.
pub async fn send_all(
    producer: &FutureProducer,
    topic: &str,
    records: impl IntoIterator<Item = Record>,
) -> Result<u64, KafkaError> {
    send_paced(producer, topic, records, None, |_| {}).await
}

/// Sends every record, at `rate` records per second when given, and reports progress (records
/// delivered so far) to `progress`. Each record's timestamp is its intended send time: at a fixed
/// rate, `start + i / rate`, even when the producer falls behind. Records are handed to the
/// client at that time (not when a future is first polled), so pacing holds under load.
pub async fn send_paced(
    producer: &FutureProducer,
    topic: &str,
    records: impl IntoIterator<Item = Record>,
    rate: Option<f64>,
    mut progress: impl FnMut(u64),
) -> Result<u64, KafkaError> {
    // Connect and learn the topic's partitions before the clock starts, so that connecting is
    // not counted as latency of the first records.
    producer
        .client()
        .fetch_metadata(Some(topic), Timeout::After(Duration::from_secs(30)))?;
    let mut pending = Pending {
        futures: FuturesUnordered::new(),
        delivered: 0,
    };
    let start = tokio::time::Instant::now();
    let start_ms = now_ms();
    for (i, r) in records.into_iter().enumerate() {
        let timestamp_ms = match rate.filter(|r| *r > 0.0) {
            Some(rate) => {
                let offset = Duration::from_secs_f64(i as f64 / rate);
                pending.until(start + offset).await?;
                start_ms + offset.as_millis() as i64
            }
            None => now_ms(),
        };
        while pending.futures.len() >= IN_FLIGHT {
            pending.one().await?;
        }
        enqueue(producer, topic, &r, timestamp_ms, &mut pending).await?;
        if i % 1024 == 0 {
            progress(pending.delivered);
        }
    }
    while !pending.futures.is_empty() {
        pending.one().await?;
        if pending.delivered % 1024 == 0 {
            progress(pending.delivered);
        }
    }
    producer.flush(Timeout::After(Duration::from_secs(30)))?;
    progress(pending.delivered);
    Ok(pending.delivered)
}

/// Delivery reports still to come.
struct Pending {
    futures: FuturesUnordered<DeliveryFuture>,
    delivered: u64,
}

impl Pending {
    /// Waits for one delivery report.
    async fn one(&mut self) -> Result<(), KafkaError> {
        match self.futures.next().await {
            Some(Ok(Ok(_))) => self.delivered += 1,
            Some(Ok(Err((e, _)))) => return Err(e),
            Some(Err(_)) => return Err(KafkaError::Canceled),
            None => {}
        }
        Ok(())
    }

    /// Collects delivery reports until `due`.
    async fn until(&mut self, due: tokio::time::Instant) -> Result<(), KafkaError> {
        while tokio::time::Instant::now() < due {
            if self.futures.is_empty() {
                tokio::time::sleep_until(due).await;
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                r = self.one() => r?,
            }
        }
        Ok(())
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Hands one record to the client now; waits for deliveries while its queue is full.
async fn enqueue(
    producer: &FutureProducer,
    topic: &str,
    r: &Record,
    timestamp_ms: i64,
    pending: &mut Pending,
) -> Result<(), KafkaError> {
    loop {
        let headers = match &r.id {
            Some(id) => OwnedHeaders::new().insert(Header {
                key: "id",
                value: Some(id.as_bytes()),
            }),
            None => OwnedHeaders::new(),
        };
        let mut record = FutureRecord::to(topic)
            .key(r.key.as_bytes())
            .headers(headers)
            .timestamp(timestamp_ms);
        if let Some(v) = &r.value {
            record = record.payload(v.as_slice());
        }
        match producer.send_result(record) {
            Ok(delivery) => {
                pending.futures.push(delivery);
                return Ok(());
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                if pending.futures.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                } else {
                    pending.one().await?;
                }
            }
            Err((e, _)) => return Err(e),
        }
    }
}

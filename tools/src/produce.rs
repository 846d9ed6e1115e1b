//! Writes records to a topic in the wire contract: header `id`, key = account id, JSON value.
//! Each record's Kafka timestamp is its send time, so latency is measured from there; the time
//! from that timestamp to the broker's acknowledgement is recorded per record ([`Sent::acked_ms`]),
//! the producer-and-broker part of a record's latency.

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::generate::Record;
use batch_inbox::stats_file::Percentiles;
use batch_inbox::KafkaClientError;

/// Most records awaiting delivery at once.
const IN_FLIGHT: usize = 20_000;

/// Creates `topic` with `partitions` partitions unless it exists.
pub async fn ensure_topic(brokers: &str, topic: &str, partitions: i32) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    // -1: the broker's default.replication.factor (KIP-464), so that a topic on a 3-node cluster
    // is replicated 3 times and one on a single node once.
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
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

/// Sends one record to `<topic>-warmup` (created with one partition) and waits for its delivery,
/// so that the producer is ready before a paced run's clock starts: an idempotent producer sends
/// nothing until the broker has given it a producer id, and librdkafka asks for one on a timer, up
/// to about 0.5 s after it connects. Without this, the records of a run's first half second wait
/// for the id, and at 100 records/s that wait alone is the run's p99 (measured: acknowledgement
/// p99 302 ms, p99.9 481 ms without it; 8 ms and 10 ms with idempotence off).
pub async fn warm_up(
    brokers: &str,
    producer: &FutureProducer,
    topic: &str,
) -> Result<(), KafkaError> {
    let side = format!("{topic}-warmup");
    ensure_topic(brokers, &side, 1).await?;
    let record = FutureRecord::<[u8], [u8]>::to(&side).payload(b"warm-up".as_slice());
    match producer
        .send(record, Timeout::After(Duration::from_secs(30)))
        .await
    {
        Ok(_) => Ok(()),
        Err((e, _)) => Err(e),
    }
}

/// Sends every record and waits for each delivery; returns how many were delivered.
pub async fn send_all(
    producer: &FutureProducer,
    topic: &str,
    records: impl IntoIterator<Item = Record>,
) -> Result<u64, KafkaError> {
    Ok(send_paced(producer, topic, records, None, |_| {})
        .await?
        .delivered)
}

/// What [`send_paced`] delivered.
#[derive(Debug)]
pub struct Sent {
    /// Records the broker acknowledged.
    pub delivered: u64,
    /// Per record, the record's timestamp (its intended send time) to its acknowledgement, in
    /// ms: producer queueing and linger, the produce request and the broker's append.
    pub acked_ms: Percentiles,
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
) -> Result<Sent, KafkaError> {
    // Connect and learn the topic's partitions before the clock starts, so that connecting is
    // not counted as latency of the first records.
    producer
        .client()
        .fetch_metadata(Some(topic), Timeout::After(Duration::from_secs(30)))?;
    let mut pending = Pending {
        futures: FuturesUnordered::new(),
        delivered: 0,
        // 1 ms to 1 hour, 3 significant digits.
        acked_ms: Histogram::new_with_bounds(1, 3_600_000, 3).expect("valid histogram bounds"),
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
        pending.ready()?;
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
    let acked_ms = Percentiles::of(&pending.acked_ms, 1.0);
    Ok(Sent {
        delivered: pending.delivered,
        acked_ms,
    })
}

/// Delivery reports still to come.
struct Pending {
    futures: FuturesUnordered<DeliveryFuture>,
    delivered: u64,
    acked_ms: Histogram<u64>,
}

impl Pending {
    /// Waits for one delivery report.
    async fn one(&mut self) -> Result<(), KafkaError> {
        match self.futures.next().await {
            Some(Ok(Ok(delivery))) => {
                self.delivered += 1;
                if let Some(sent_ms) = delivery.timestamp.to_millis() {
                    self.acked_ms
                        .saturating_record((now_ms() - sent_ms).max(1) as u64);
                }
            }
            Some(Ok(Err((e, _)))) => return Err(e),
            Some(Err(_)) => return Err(KafkaError::Canceled),
            None => {}
        }
        Ok(())
    }

    /// Collects the delivery reports that have arrived, without waiting, so their
    /// acknowledgement times are read when they arrive even when the producer runs behind.
    fn ready(&mut self) -> Result<(), KafkaError> {
        use futures::FutureExt;
        while !self.futures.is_empty() {
            match self.one().now_or_never() {
                Some(r) => r?,
                None => break,
            }
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

//! Shared test fixtures: a fresh database per test, a mock Kafka cluster per test, a processor
//! run to the end of its topic, and a wire-level statement counter.
#![allow(dead_code)]

pub mod blackhole;
pub mod broker;
pub mod child;
pub mod group;
pub mod http;
pub mod ledger_checks;
pub mod nats;
pub mod postgres;
pub mod raw_producer;
pub mod retention;
pub mod scenario;
pub mod secure_broker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use batch_inbox::ledger::Ledger;
use batch_inbox::KafkaSettings;
use batch_inbox::StatsSnapshot;
use batch_inbox::{db, Mode, ProcessorConfig};
use batch_inbox::{RetryPolicy, WorkerSettings};
use deadpool_postgres::Pool;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Where the tests' PostgreSQL is (`TEST_DATABASE_HOST` overrides, e.g. `127.0.0.1:5432`).
pub fn pg_host() -> String {
    std::env::var("TEST_DATABASE_HOST").unwrap_or_else(|_| "127.0.0.1:5432".to_owned())
}

pub fn db_url(name: &str) -> String {
    let host = pg_host();
    let (h, p) = host.split_once(':').unwrap_or((&host, "5432"));
    format!("postgres://postgres@{h}:{p}/{name}")
}

/// The database name of test `name`.
pub fn db_name(name: &str) -> String {
    let prefix = std::env::var("TEST_DATABASE_PREFIX").unwrap_or_else(|_| "bi_".to_owned());
    format!("{prefix}{name}")
}

/// Drops and creates database `<prefix><name>`, migrates it (the core's tables and the ledger's),
/// returns its URL and a pool. The prefix is `bi_`, or `TEST_DATABASE_PREFIX` so that two
/// checkouts can run their tests at once.
pub async fn fresh_db(name: &str) -> (String, Pool) {
    let (url, pool) = fresh_core_db(name).await;
    batch_inbox::ledger::migrate(&pool).await.unwrap();
    (url, pool)
}

/// [`fresh_db`] with the core's tables alone, as `migrate --handler sql` leaves a SQL handler's
/// database: no `balances`.
pub async fn fresh_core_db(name: &str) -> (String, Pool) {
    let (url, pool) = empty_db(name).await;
    db::migrate(&pool).await.unwrap();
    (url, pool)
}

/// Drops and creates database `<prefix><name>`, with no table; returns its URL and a pool.
pub async fn empty_db(name: &str) -> (String, Pool) {
    let db = db_name(name);
    let admin = db::connect(&db_url("postgres"), 1)
        .await
        .expect("PostgreSQL must run on 127.0.0.1:5432 (scripts/test.sh starts it)");
    let c = admin.get().await.unwrap();
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .unwrap();
    c.batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let url = db_url(&db);
    let pool = db::connect(&url, 8).await.unwrap();
    (url, pool)
}

/// An in-process Kafka cluster with one topic.
pub struct Kafka {
    pub cluster: MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    pub brokers: String,
    pub topic: String,
    producer: FutureProducer,
}

impl Kafka {
    pub fn new(topic: &str, partitions: i32) -> Self {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic(topic, partitions, 1).unwrap();
        let brokers = cluster.bootstrap_servers();
        let producer = batch_inbox_tools::produce::producer(&brokers, &[]).unwrap();
        Kafka {
            cluster,
            brokers,
            topic: topic.to_owned(),
            producer,
        }
    }

    /// Sends one record to an explicit partition.
    pub async fn send(
        &self,
        partition: i32,
        key: Option<&str>,
        value: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
    ) {
        let mut hs = OwnedHeaders::new();
        for (k, v) in headers {
            hs = hs.insert(Header { key: k, value: *v });
        }
        let mut r: FutureRecord<'_, str, [u8]> = FutureRecord::to(&self.topic)
            .partition(partition)
            .headers(hs);
        if let Some(k) = key {
            r = r.key(k);
        }
        if let Some(v) = value {
            r = r.payload(v);
        }
        self.producer
            .send(r, Timeout::After(Duration::from_secs(10)))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }

    /// Sends a ledger entry with id header `id` to `partition`.
    pub async fn send_entry(&self, partition: i32, id: &str, account: i64, amount: i64) {
        let value = format!(r#"{{"account_id":{account},"amount":{amount}}}"#);
        self.send(
            partition,
            Some(&account.to_string()),
            Some(value.as_bytes()),
            &[("id", Some(id.as_bytes()))],
        )
        .await;
    }

    /// Sends generated records, keyed by account (partitioned by key hash).
    pub async fn send_generated(&self, records: Vec<batch_inbox_tools::generate::Record>) {
        batch_inbox_tools::produce::send_all(&self.producer, &self.topic, records)
            .await
            .unwrap();
    }

    pub fn settings(&self, group: &str) -> KafkaSettings {
        let mut kafka = KafkaSettings::new(&self.brokers, &self.topic, group);
        kafka.partition_eof = true;
        kafka.overrides = vec![
            ("session.timeout.ms".to_owned(), "6000".to_owned()),
            ("heartbeat.interval.ms".to_owned(), "500".to_owned()),
        ];
        kafka
    }
}

/// A processor's settings: the product's defaults (natural batching, offsets in the database, a
/// 30 s statement timeout), at most `batch_size` records per batch, fast retries, no poison-rate
/// breaker, run until the topic is drained. A test about batch shapes sets linger batching
/// itself ([`with_linger`]).
pub fn config(kafka: KafkaSettings, mode: Mode, batch_size: usize) -> ProcessorConfig {
    let mut config = ProcessorConfig::new(kafka);
    config.worker.mode = mode;
    config.worker.batcher.max_items = batch_size.try_into().unwrap();
    config.worker.retry = RetryPolicy::new(Duration::from_millis(20), Duration::from_millis(500));
    config.worker.max_poison_rate = None;
    config.exit_on_eof = true;
    config
}

/// `config` with linger batching: a batch closes on its limits, after `linger`, or at the end of
/// the partition, so that its shape does not depend on how records reach the worker.
pub fn with_linger(mut config: ProcessorConfig, linger: Duration) -> ProcessorConfig {
    config.worker.batching = batch_inbox::Batching::Linger;
    config.worker.batcher.linger = linger;
    config
}

/// Runs a ledger processor until its topic is drained and committed (at most 60 s).
pub async fn drain(config: ProcessorConfig, pool: &Pool) -> StatsSnapshot {
    drain_with(config, pool, Arc::new(Ledger)).await
}

/// [`drain`] with any handler.
pub async fn drain_with<H: batch_inbox::Handler>(
    config: ProcessorConfig,
    pool: &Pool,
    handler: Arc<H>,
) -> StatsSnapshot {
    init_tracing();
    let run = batch_inbox::run(config, pool.clone(), handler, std::future::pending());
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("topic drained within 60 s")
        .expect("processor succeeded")
        .snapshot()
}

/// Logs to the test's output, filtered by RUST_LOG (nothing by default).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Counts the round trips a client makes: simple queries ('Q') and extended-protocol syncs
/// ('S'), by reading the frontend side of the wire between the client and PostgreSQL.
pub struct RoundTripCounter {
    pub addr: SocketAddr,
    count: Arc<AtomicU64>,
}

impl RoundTripCounter {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicU64::new(0));
        let c = count.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    let server = TcpStream::connect(pg_host()).await.unwrap();
                    proxy(client, server, c).await;
                });
            }
        });
        RoundTripCounter { addr, count }
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@{}/{db}", self.addr)
    }

    pub fn get(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }
}

async fn proxy(client: TcpStream, server: TcpStream, count: Arc<AtomicU64>) {
    client.set_nodelay(true).unwrap();
    server.set_nodelay(true).unwrap();
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
    });
    // Startup message: length-prefixed, no type byte.
    let mut len = [0u8; 4];
    if cr.read_exact(&mut len).await.is_err() {
        return;
    }
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize - 4];
    cr.read_exact(&mut body).await.unwrap();
    sw.write_all(&len).await.unwrap();
    sw.write_all(&body).await.unwrap();
    // Then typed messages: a type byte and a length.
    loop {
        let mut head = [0u8; 5];
        if cr.read_exact(&mut head).await.is_err() {
            break;
        }
        let n = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize - 4;
        let mut message = head.to_vec();
        message.resize(5 + n, 0);
        if cr.read_exact(&mut message[5..]).await.is_err() {
            break;
        }
        if head[0] == b'Q' || head[0] == b'S' {
            count.fetch_add(1, Ordering::SeqCst);
        }
        if sw.write_all(&message).await.is_err() {
            break;
        }
    }
    back.abort();
}

/// Every table of the ledger, as comparable values.
#[derive(Debug, PartialEq, Eq)]
pub struct Tables {
    pub inbox: Vec<(uuid::Uuid, i32, i64)>,
    pub balances: Vec<(i64, i64)>,
    pub dead_letters: Vec<(i32, i64, Option<String>, String)>,
}

pub async fn tables(pool: &Pool) -> Tables {
    let c = pool.get().await.unwrap();
    let inbox = c
        .query(
            "SELECT message_id, partition, \"offset\" FROM inbox ORDER BY message_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let balances = c
        .query("SELECT account_id, amount FROM balances ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let dead_letters = c
        .query(
            "SELECT partition, \"offset\", message_id, reason FROM dead_letters ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    Tables {
        inbox,
        balances,
        dead_letters,
    }
}

pub fn uuid(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// A ledger record of partition 0 of topic `t`: id header `id`, value `{account_id, amount}`.
pub fn ledger_record(offset: i64, id: &str, account: i64, amount: i64) -> batch_inbox::RawMessage {
    batch_inbox::RawMessage {
        topic: Arc::from("t"),
        partition: 0,
        offset,
        timestamp_ms: None,
        key: None,
        payload: Some(bytes::Bytes::from(format!(
            r#"{{"account_id":{account},"amount":{amount}}}"#
        ))),
        headers: vec![batch_inbox::Header {
            key: "id".into(),
            value: Some(bytes::Bytes::copy_from_slice(id.as_bytes())),
        }],
        header_error: None,
    }
}

/// An offset sink that records every stored position, in order.
#[derive(Default)]
pub struct Recorded(pub std::sync::Mutex<Vec<i64>>);

impl batch_inbox::internals::worker::OffsetSink for Recorded {
    fn store(&self, _topic: &str, _partition: i32, next_offset: i64) -> Result<(), String> {
        self.0.lock().unwrap().push(next_offset);
        Ok(())
    }
}

/// Worker settings with linger batching and a 60 s linger (batches close on size, or at the
/// source's end), for the tests that drive a partition worker and count its batches.
pub fn worker_settings(mode: Mode, max_items: usize, max_bytes: usize) -> WorkerSettings {
    let mut settings = WorkerSettings::default();
    settings.mode = mode;
    settings.batcher.max_items = max_items.try_into().unwrap();
    settings.batcher.max_bytes = max_bytes.try_into().unwrap();
    settings.batcher.linger = Duration::from_secs(60);
    settings.batching = batch_inbox::Batching::Linger;
    settings.max_poison_rate = None;
    settings
}

/// The processor's HTTP listener (`/metrics`, `/healthz`, `/readyz`) on a free port of
/// 127.0.0.1, reading `stats` and the database at `url`, until `stop`; returns its address.
pub async fn listener(
    url: &str,
    pool: &Pool,
    stats: &Arc<batch_inbox::Stats>,
    stop: &tokio_util::sync::CancellationToken,
) -> SocketAddr {
    let any_port = "127.0.0.1:0".parse().unwrap();
    batch_inbox::internals::exporter::start(
        any_port,
        url,
        pool.clone(),
        stats.clone(),
        stop.clone(),
    )
    .await
    .unwrap()
}

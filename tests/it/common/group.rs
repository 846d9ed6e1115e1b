//! Fixtures for fault tests of a running group: a processor in the background, waiting on
//! conditions, and the two places offsets are kept (Kafka's committed offsets, the database's
//! `consumer_offsets`), sampled so that tests can check they never go backwards.
//! Used as `common::group`.
#![allow(dead_code)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use batch_inbox::ledger::Ledger;
use batch_inbox::Stats;
use batch_inbox::{Handler, ProcessorConfig};
use deadpool_postgres::Pool;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::oneshot;

/// A processor running in the background until told to stop.
pub struct Member {
    pub stats: Arc<Stats>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Member {
    pub fn start(cfg: ProcessorConfig, pool: &Pool) -> Member {
        Self::start_with(cfg, pool, Arc::new(Ledger))
    }

    pub fn start_with<H: Handler>(cfg: ProcessorConfig, pool: &Pool, handler: Arc<H>) -> Member {
        super::init_tracing();
        let stats = Arc::new(Stats::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let run =
            batch_inbox::run_with_stats(cfg, pool.clone(), handler, stats.clone(), async move {
                let _ = stopped.await;
            });
        let task = tokio::spawn(async move { run.await.expect("member ran without error") });
        Member { stats, stop, task }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("member stopped within 60 s")
            .unwrap();
    }
}

/// Polls `done` every 20 ms until it holds; fails after `secs` seconds.
pub async fn wait_for<F, Fut>(what: &str, secs: u64, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn inbox_rows(pool: &Pool) -> u64 {
    let c = pool.get().await.unwrap();
    let n: i64 = c
        .query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0);
    n as u64
}

/// Reads a group's committed offsets without joining it.
pub struct OffsetReader {
    consumer: BaseConsumer,
    topic: String,
    partitions: i32,
}

impl OffsetReader {
    pub fn new(brokers: &str, group: &str, topic: &str, partitions: i32) -> Self {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        OffsetReader {
            consumer,
            topic: topic.to_owned(),
            partitions,
        }
    }

    fn list(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition(&self.topic, p);
        }
        tpl
    }

    /// Kafka's committed next offset per partition (-1: none), or `None` when the coordinator
    /// could not answer (e.g. while the broker is down).
    pub fn committed(&self) -> Option<Vec<i64>> {
        let tpl = self
            .consumer
            .committed_offsets(self.list(), Duration::from_secs(5))
            .ok()?;
        Some(
            (0..self.partitions)
                .map(
                    |p| match tpl.find_partition(&self.topic, p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => o,
                        _ => -1,
                    },
                )
                .collect(),
        )
    }

    /// The high watermark (end) of each partition.
    pub fn ends(&self) -> Vec<i64> {
        (0..self.partitions)
            .map(|p| {
                self.consumer
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(5))
                    .unwrap()
                    .1
            })
            .collect()
    }
}

/// The database's stored next offset per partition of `group` (-1: none).
pub async fn db_offsets(pool: &Pool, group: &str, partitions: i32) -> Vec<i64> {
    let c = pool.get().await.unwrap();
    let rows = c
        .query(
            "SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1",
            &[&group],
        )
        .await
        .unwrap();
    let mut out = vec![-1; partitions as usize];
    for r in rows {
        out[r.get::<_, i32>(0) as usize] = r.get(1);
    }
    out
}

/// Samples Kafka's committed offsets in a background thread until dropped; `check` then says
/// whether any partition's committed offset ever went backwards.
pub struct CommittedSampler {
    samples: Arc<Mutex<Vec<Vec<i64>>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CommittedSampler {
    pub fn start(reader: OffsetReader) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, st) = (samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(std::sync::atomic::Ordering::SeqCst) {
                if let Some(c) = reader.committed() {
                    s.lock().unwrap().push(c);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        CommittedSampler {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops sampling; panics if a committed offset ever moved backwards. Returns the samples.
    pub fn finish(mut self) -> Vec<Vec<i64>> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let samples = self.samples.lock().unwrap().clone();
        for w in samples.windows(2) {
            for (p, (a, b)) in w[0].iter().zip(&w[1]).enumerate() {
                assert!(
                    b >= a,
                    "partition {p}: committed offset went back from {a} to {b}"
                );
            }
        }
        samples
    }
}

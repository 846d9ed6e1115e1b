//! The seam driven by a source that is not Kafka: an in-memory source of two partitions runs the
//! pipeline as the processor wires it (the real inbox transaction, the ledger, PostgreSQL), and
//! the exact database state and acknowledgements come out. What a RabbitMQ or JetStream source
//! does, with nothing of the pipeline changed.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use futures::StreamExt;

use super::*;
use crate::handlers::ledger::{self, Ledger};
use crate::source::{RawMessage, Source};

/// PostgreSQL of the tests (`TEST_DATABASE_HOST`, as the integration tests read it).
fn db_url(name: &str) -> String {
    let host = std::env::var("TEST_DATABASE_HOST").unwrap_or_else(|_| "127.0.0.1:5432".into());
    let (h, p) = host.split_once(':').unwrap_or((&host, "5432"));
    format!("postgres://postgres@{h}:{p}/{name}")
}

async fn fresh_db(name: &str) -> Pool {
    let prefix = std::env::var("TEST_DATABASE_PREFIX").unwrap_or_else(|_| "bi_".to_owned());
    let db = format!("{prefix}{name}");
    let admin = crate::db::connect(&db_url("postgres"), 1)
        .await
        .expect("PostgreSQL must run on 127.0.0.1:5432 (scripts/test.sh starts it)");
    let c = admin.get().await.expect("a connection");
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .expect("drop");
    c.batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .expect("create");
    let pool = crate::db::connect(&db_url(&db), 4).await.expect("connect");
    crate::db::migrate(&pool).await.expect("core migrations");
    ledger::migrate(&pool).await.expect("ledger migrations");
    pool
}

/// Every acknowledgement, in order, by partition, each compared with the database's position
/// at the moment it is made.
struct Acks {
    pool: Pool,
    made: Mutex<Vec<(i32, i64)>>,
    /// Acknowledgements of a position the database did not hold yet: there must be none.
    before_commit: Mutex<Vec<(i32, i64, Option<i64>)>>,
}

impl OffsetSink for Acks {
    fn store(&self, topic: &str, partition: i32, next_offset: i64) -> Result<(), String> {
        let stored: Option<i64> = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                let c = self.pool.get().await.expect("a connection");
                let sql = "SELECT next_offset FROM consumer_offsets \
                           WHERE group_id = 'memory' AND topic = $1 AND partition = $2";
                let row = c.query_opt(sql, &[&topic, &partition]).await;
                row.expect("read").map(|r| r.get(0))
            })
        });
        if stored.is_none_or(|db| db < next_offset) {
            let mut early = self.before_commit.lock().expect("not poisoned");
            early.push((partition, next_offset, stored));
        }
        self.made
            .lock()
            .expect("not poisoned")
            .push((partition, next_offset));
        Ok(())
    }
}

/// A source of fixed records: each partition's records, then its end; done once every run is at
/// its end with everything committed.
struct Memory {
    topic: Arc<str>,
    partitions: Vec<Vec<RawMessage>>,
    acks: Arc<Acks>,
}

impl Source for Memory {
    async fn run(
        self,
        partitions: Arc<dyn Partitions>,
        _shutdown: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let mut runs = Vec::new();
        for (p, records) in self.partitions.into_iter().enumerate() {
            let p = i32::try_from(p).expect("few partitions");
            let run = partitions.start(self.topic.clone(), p, None, self.acks.clone());
            let input = futures::stream::iter(records.into_iter().map(Input::Record))
                .chain(futures::stream::iter([Input::Eof]))
                .chain(futures::stream::pending());
            let body = run.run;
            let join = tokio::spawn(async move { body.run(input.boxed()).await });
            runs.push((run.stop, run.at_eof, join));
        }
        let done = async {
            while !runs.iter().all(|(_, eof, _)| eof.load(Ordering::Acquire)) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), done)
            .await
            .expect("every partition reaches its end");
        for (stop, _, _) in &runs {
            stop.cancel();
        }
        for (_, _, join) in runs {
            join.await.expect("the run does not panic")?;
        }
        Ok(())
    }
}

fn record(partition: i32, offset: i64, id: u128, account: i64, amount: i64) -> RawMessage {
    let mut raw = crate::pipeline::message::tests::raw(
        offset,
        Some(&uuid::Uuid::from_u128(id).to_string()),
        &format!(r#"{{"account_id": {account}, "amount": {amount}}}"#),
    );
    raw.topic = Arc::from("memory");
    raw.partition = partition;
    raw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_is_not_kafka_runs_the_pipeline_unchanged() {
    let pool = fresh_db("unit_memory_source").await;
    // Partition 0: ids 1..=50 at offsets 0..50, then id 7 again (a redelivery) at offset 50.
    // Partition 1: ids 101..=130 at offsets 10..40 (a source need not start at 0); id 1 of
    // partition 0 again at offset 40 (the same message on another partition: whichever commits
    // first applies it).
    let mut p0: Vec<RawMessage> = (0..50)
        .map(|o| record(0, o, 1 + o as u128, 1, 10))
        .collect();
    p0.push(record(0, 50, 7, 1, 10));
    let mut p1: Vec<RawMessage> = (10..40)
        .map(|o| record(1, o, 91 + o as u128, 2, 5))
        .collect();
    p1.push(record(1, 40, 1, 1, 10));
    let acks = Arc::new(Acks {
        pool: pool.clone(),
        made: Mutex::default(),
        before_commit: Mutex::default(),
    });
    let source = Memory {
        topic: Arc::from("memory"),
        partitions: vec![p0, p1],
        acks: acks.clone(),
    };
    let mut config = ProcessorConfig::new(KafkaSettings::new("unused", "memory", "memory"));
    config.worker.batcher.max_items = 8.try_into().expect("non-zero");
    let stats = Arc::new(Stats::default());
    let workers = Workers::new(
        &config,
        Some("memory"),
        pool.clone(),
        Arc::new(Ledger),
        stats.clone(),
    );
    source
        .run(workers, std::future::pending())
        .await
        .expect("runs");

    let c = pool.get().await.expect("a connection");
    let count = |sql: &'static str| {
        let c = &c;
        async move { c.query_one(sql, &[]).await.expect("query").get::<_, i64>(0) }
    };
    assert_eq!(count("SELECT count(*) FROM inbox").await, 80);
    assert_eq!(
        count("SELECT amount FROM balances WHERE account_id = 1").await,
        500
    );
    assert_eq!(
        count("SELECT amount FROM balances WHERE account_id = 2").await,
        150
    );
    assert_eq!(count("SELECT count(*) FROM dead_letters").await, 0);
    let positions = c
        .query(
            "SELECT partition, next_offset FROM consumer_offsets \
             WHERE group_id = 'memory' AND topic = 'memory' ORDER BY partition",
            &[],
        )
        .await
        .expect("positions");
    let positions: Vec<(i32, i64)> = positions.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(positions, [(0, 51), (1, 41)]);

    // Acknowledged per partition in order, up to the position after its last record, and each
    // only once the database held it.
    let early = acks.before_commit.lock().expect("not poisoned").clone();
    assert_eq!(
        early,
        [],
        "acknowledged before the COMMIT: (partition, position, database's)"
    );
    let acks = acks.made.lock().expect("not poisoned").clone();
    for (partition, last) in [(0, 51), (1, 41)] {
        let mine: Vec<i64> = acks
            .iter()
            .filter(|(p, _)| *p == partition)
            .map(|(_, o)| *o)
            .collect();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
        assert_eq!(mine.last(), Some(&last), "{mine:?}");
    }
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.records, 82);
    assert_eq!(snapshot.new, 80);
    assert_eq!(snapshot.duplicates, 2);
    // What /metrics serves, for a service with an HTTP server of its own.
    let metrics = stats.openmetrics();
    let new = metrics
        .lines()
        .find(|l| l.starts_with("batch_inbox_messages_new_total"))
        .unwrap_or_else(|| panic!("no messages_new in {metrics}"));
    assert!(new.ends_with(" 80"), "{new}");
}

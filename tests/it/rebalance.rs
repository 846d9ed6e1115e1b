//! Group membership changes under load: a member joins (partitions move to it) and leaves
//! (they move back). Every message is applied exactly once, by whichever member owned it.

use crate::common;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use batch_inbox::ledger::Ledger;
use batch_inbox::Mode;
use batch_inbox::Stats;
use batch_inbox_tools::generate::{Generator, GeneratorSettings, Model};
use batch_inbox_tools::verify::{differences, observe};
use common::*;
use deadpool_postgres::Pool;
use tokio::sync::oneshot;

/// A processor running in the background until told to stop.
struct Member {
    stats: Arc<Stats>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn start(kafka: &Kafka, pool: &Pool) -> Member {
    init_tracing();
    let mut cfg = config(kafka.settings("shared-group"), Mode::Batched, 50);
    cfg.exit_on_eof = false;
    let stats = Arc::new(Stats::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let run = batch_inbox::run_with_stats(
        cfg,
        pool.clone(),
        Arc::new(Ledger),
        stats.clone(),
        async move {
            let _ = stopped.await;
        },
    );
    let task = tokio::spawn(async move { run.await.expect("member ran without error") });
    Member { stats, stop, task }
}

impl Member {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("member stopped within 60 s")
            .unwrap();
    }
}

async fn wait_for(
    what: &str,
    mut done: impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>>,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Generated input and the model of everything sent so far.
struct Feed {
    input: Generator,
    model: Model,
}

impl Feed {
    fn next(&mut self, n: usize) -> Vec<batch_inbox_tools::generate::Record> {
        let model = &mut self.model;
        self.input
            .by_ref()
            .take(n)
            .inspect(|r| model.apply(r))
            .collect()
    }
}

async fn inbox_rows(pool: &Pool) -> u64 {
    let c = pool.get().await.unwrap();
    let n: i64 = c
        .query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0);
    n as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_joining_and_leaving_apply_each_message_once() {
    let (_, pool) = fresh_db("rebalance").await;
    let kafka = Kafka::new("rebalance", 6);
    let mut feed = Feed {
        input: Generator::new(GeneratorSettings {
            messages: u64::MAX,
            accounts: 200,
            ..GeneratorSettings::default()
        }),
        model: Model::default(),
    };

    let first = start(&kafka, &pool);
    kafka.send_generated(feed.next(2_000)).await;
    // The first member owns every partition before the second joins.
    let first_stats = first.stats.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while first_stats.snapshot().records < 2_000 {
        assert!(
            Instant::now() < deadline,
            "the first member never drained its input"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Until the second member owns partitions, keep traffic flowing to every partition.
    let second = start(&kafka, &pool);
    let second_stats = second.stats.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while second_stats.snapshot().records == 0 {
        assert!(
            Instant::now() < deadline,
            "the joining member never received records"
        );
        kafka.send_generated(feed.next(100)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kafka.send_generated(feed.next(2_000)).await;
    // The second member leaves: its partitions go back to the first.
    second.stop().await;
    kafka.send_generated(feed.next(2_000)).await;
    let expected = feed.model.expected().clone();
    let p = pool.clone();
    wait_for("every valid id in the inbox", move || {
        let p = p.clone();
        let want = expected.new;
        Box::pin(async move { inbox_rows(&p).await == want })
    })
    .await;
    first.stop().await;

    let expected = feed.model.expected();
    let (a, b) = (first_stats.snapshot(), second_stats.snapshot());
    assert!(b.records > 0 && a.records > 0);
    assert_eq!(
        a.new + b.new,
        expected.new,
        "each id applied by exactly one member"
    );
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, expected), Vec::<String>::new());
}

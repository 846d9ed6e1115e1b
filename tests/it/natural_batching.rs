//! Natural batching (`--batching natural`, no minimum wait): a record that reaches an idle
//! partition worker is applied at once, and the records ready at that moment go in the same
//! batch, up to its limits (linger batching with no linger would apply each record alone).

use crate::common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use batch_inbox::internals::inbox::Inbox;
use batch_inbox::internals::worker::{Input, PartitionWorker};
use batch_inbox::ledger::Ledger;
use batch_inbox::Batching;
use batch_inbox::Mode;
use batch_inbox::Stats;
use common::*;
use futures::channel::mpsc;
use tokio_util::sync::CancellationToken;

/// A worker with natural batching, no minimum wait and at most `max_items` per batch, fed by a
/// channel that holds the records of `ready` before the worker starts reading.
async fn start(
    name: &str,
    max_items: usize,
    ready: std::ops::Range<i64>,
) -> (
    mpsc::UnboundedSender<Input>,
    Arc<Recorded>,
    Arc<Stats>,
    tokio::task::JoinHandle<()>,
) {
    let (_url, pool) = fresh_db(name).await;
    let (tx, rx) = mpsc::unbounded();
    send(&tx, ready);
    let sink = Arc::new(Recorded::default());
    let stats = Arc::new(Stats::default());
    let mut settings = worker_settings(Mode::Batched, max_items, 1_000_000);
    settings.batching = Batching::Natural;
    settings.batcher.linger = Duration::ZERO;
    let worker = PartitionWorker::new(
        Arc::from("t"),
        0,
        Arc::new(Inbox::new(pool, Arc::new(Ledger), "id")),
        sink.clone(),
        settings,
        stats.clone(),
        Arc::default(),
    );
    let task = tokio::spawn(async move {
        worker.run(rx, CancellationToken::new()).await.unwrap();
    });
    (tx, sink, stats, task)
}

fn send(tx: &mpsc::UnboundedSender<Input>, offsets: std::ops::Range<i64>) {
    for o in offsets {
        let record = ledger_record(o, &uuid(o as u32), 1, 1);
        tx.unbounded_send(Input::Record(record)).unwrap();
    }
}

/// Waits until the worker stored `next` as its position (30 s at most).
async fn stored(sink: &Recorded, next: i64) -> Vec<i64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = sink.0.lock().unwrap().clone();
        if now.last() == Some(&next) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "offset {next} not stored within 30 s: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_applies_at_once_and_batches_what_is_ready() {
    // Five records ready before the worker reads: one batch, applied without waiting.
    let (tx, sink, stats, task) = start("natural_idle", 100, 0..5).await;
    assert_eq!(stored(&sink, 5).await, vec![5]);
    assert_eq!(stats.snapshot().transactions, 1);
    // The worker is idle: the next record is applied at once too, in a batch of its own.
    send(&tx, 5..6);
    assert_eq!(stored(&sink, 6).await, vec![5, 6]);
    assert_eq!(stats.snapshot().transactions, 2);
    drop(tx);
    task.await.unwrap();
    assert_eq!(stats.snapshot().records, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_records_still_close_batches_at_the_size_limit() {
    let (tx, sink, stats, task) = start("natural_limit", 3, 0..7).await;
    assert_eq!(stored(&sink, 7).await, vec![3, 6, 7]);
    assert_eq!(stats.snapshot().transactions, 3);
    drop(tx);
    task.await.unwrap();
}

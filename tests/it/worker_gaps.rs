//! Offset-gap detection: a partition worker counts every record whose offset is not the previous
//! record's + 1 (records the source skipped), and still applies every record it did receive.

use crate::common;
use std::sync::Arc;

use batch_inbox::internals::inbox::Inbox;
use batch_inbox::internals::worker::{Input, PartitionWorker};
use batch_inbox::ledger::Ledger;
use batch_inbox::Mode;
use batch_inbox::Stats;
use batch_inbox::{Header, RawMessage};
use bytes::Bytes;
use common::*;
use tokio_util::sync::CancellationToken;

fn record(offset: i64) -> RawMessage {
    RawMessage {
        topic: Arc::from("t"),
        partition: 0,
        offset,
        timestamp_ms: None,
        key: None,
        payload: Some(Bytes::from(format!(
            r#"{{"account_id":1,"amount":{}}}"#,
            offset + 1
        ))),
        headers: vec![Header {
            key: "id".into(),
            value: Some(Bytes::from(uuid(offset as u32))),
        }],
        header_error: None,
    }
}

/// Feeds `offsets` to a fresh worker and returns its stats and the offsets it stored.
async fn run_worker(name: &str, offsets: &[i64]) -> (Arc<Stats>, Vec<i64>, i64) {
    let (_url, pool) = fresh_db(name).await;
    let sink = Arc::new(Recorded::default());
    let stats = Arc::new(Stats::default());
    let settings = worker_settings(Mode::Batched, 2, 1_000_000);
    let worker = PartitionWorker::new(
        Arc::from("t"),
        0,
        Arc::new(Inbox::new(pool.clone(), Arc::new(Ledger), "id")),
        sink.clone(),
        settings,
        stats.clone(),
        Arc::default(),
    );
    let input = futures::stream::iter(offsets.iter().map(|&o| Input::Record(record(o))));
    worker.run(input, CancellationToken::new()).await.unwrap();
    let applied: i64 = pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0);
    let stored = sink.0.lock().unwrap().clone();
    (stats, stored, applied)
}

#[tokio::test]
async fn a_skipped_offset_is_counted_as_a_gap() {
    // Starts at 10 (an assignment need not start at 0), then skips 13-14 and 17.
    let (stats, stored, applied) = run_worker("worker_gaps", &[10, 11, 12, 15, 16, 18]).await;
    assert_eq!(stats.snapshot().offset_gaps, 2, "two gaps: 12→15 and 16→18");
    assert_eq!(applied, 6, "every received record is applied");
    assert_eq!(stored.last(), Some(&19));
}

#[tokio::test]
async fn contiguous_offsets_are_no_gap() {
    let (stats, stored, applied) = run_worker("worker_no_gaps", &[7, 8, 9, 10, 11]).await;
    assert_eq!(stats.snapshot().offset_gaps, 0);
    assert_eq!(applied, 5);
    assert_eq!(stored, vec![9, 11, 12]);
}

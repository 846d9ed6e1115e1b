//! A batch abandoned at shutdown (the database failing while the worker stops) must be the last
//! thing the worker touches: no later batch may commit and move the offset past it.

use crate::common;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use batch_inbox::internals::inbox::Inbox;
use batch_inbox::internals::worker::{Input, PartitionWorker};
use batch_inbox::ledger::{Entry, Ledger};
use batch_inbox::HandlerError;
use batch_inbox::Stats;
use batch_inbox::{Handler, Mode, Rejection, Transaction};
use batch_inbox::{Header, Message, RawMessage};
use bytes::Bytes;
use common::*;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

/// The first call asks the worker to stop and then fails transiently; later calls succeed.
struct FailsWhileStopping {
    stop: CancellationToken,
    calls: AtomicU32,
}

impl Handler for FailsWhileStopping {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.stop.cancel();
            // A serialization failure: transient, and the connection stays usable.
            tx.batch_execute(
                "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$",
            )
            .await?;
        }
        Ledger.handle(tx, messages).await
    }
}

fn record(offset: i64) -> RawMessage {
    RawMessage {
        topic: Arc::from("t"),
        partition: 0,
        offset,
        timestamp_ms: None,
        key: None,
        // Record 1 is padded past the batch byte limit: it closes record 0's batch and its own,
        // so two batches are ready at once.
        payload: Some(Bytes::from(format!(
            r#"{{"account_id":1,"amount":{}}}{}"#,
            offset + 1,
            " ".repeat(if offset == 1 { 200 } else { 0 })
        ))),
        headers: vec![Header {
            key: "id".into(),
            value: Some(Bytes::from(uuid(offset as u32))),
        }],
        header_error: None,
    }
}

#[tokio::test]
async fn nothing_commits_after_a_batch_abandoned_at_shutdown() {
    let (url, pool) = fresh_db("worker_stop").await;
    let stop = CancellationToken::new();
    let handler = Arc::new(FailsWhileStopping {
        stop: stop.clone(),
        calls: AtomicU32::new(0),
    });
    let sink = Arc::new(Recorded::default());
    // A byte limit above one plain record, below the padded one.
    let settings = worker_settings(Mode::Batched, 10, record(0).size_bytes() + 100);
    let worker = PartitionWorker::new(
        Arc::from("t"),
        0,
        Arc::new(Inbox::new(pool.clone(), handler, "id")),
        sink.clone(),
        settings,
        Arc::new(Stats::default()),
        Arc::default(),
    );
    // Records 0 and 1 become two ready batches at once; the first fails while the worker is told
    // to stop.
    let input = futures::stream::iter((0..3).map(|o| Input::Record(record(o))))
        .chain(futures::stream::pending());
    worker.run(input, stop).await.unwrap();

    assert_eq!(
        *sink.0.lock().unwrap(),
        Vec::<i64>::new(),
        "no offset past the abandoned batch"
    );
    // A fresh pool: the processor's pool may still hold the killed connection.
    let check = batch_inbox::db::connect(&url, 1).await.unwrap();
    let c = check.get().await.unwrap();
    let applied: i64 = c
        .query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(applied, 0, "nothing after the abandoned batch was applied");
}

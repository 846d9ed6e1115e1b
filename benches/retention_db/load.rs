//! The processor's side of the retention bench: batches of new ids through the library's inbox
//! transaction (`batch_inbox::internals::inbox::Inbox::apply_batch`, a handler that does nothing), timed per
//! batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use batch_inbox::internals::inbox::Inbox;
use batch_inbox::internals::message::{decode_batch, Decoded};
use batch_inbox::Transaction;
use batch_inbox::{Decode, Handler, HandlerError, Header, Message, RawMessage, Reason, Rejection};
use bytes::Bytes;
use deadpool_postgres::{Object, Pool};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use uuid::Uuid;

/// Ids of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ids {
    V4,
    V7,
}

impl Ids {
    pub fn label(self) -> &'static str {
        match self {
            Ids::V4 => "v4",
            Ids::V7 => "v7",
        }
    }

    fn new_id(self) -> Uuid {
        match self {
            Ids::V4 => Uuid::new_v4(),
            Ids::V7 => Uuid::now_v7(),
        }
    }
}

/// No payload: the bench measures the inbox, not a business change.
#[derive(Debug, Clone)]
pub struct Nothing;

impl Decode for Nothing {
    fn decode(_: &RawMessage) -> Result<Self, (Reason, String)> {
        Ok(Nothing)
    }
}

/// A handler that changes nothing.
pub struct Noop;

impl Handler for Noop {
    type Payload = Nothing;

    async fn handle(
        &self,
        _: &Transaction<'_>,
        _: &[Message<Nothing>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        Ok(Vec::new())
    }
}

/// `count` batches of `size` new ids, decoded before any timing starts.
pub fn batches(ids: Ids, size: usize, count: usize, offset: &mut i64) -> Vec<Decoded<Nothing>> {
    let topic: Arc<str> = Arc::from("bench");
    (0..count)
        .map(|_| {
            let raws = (0..size)
                .map(|_| {
                    *offset += 1;
                    RawMessage {
                        topic: topic.clone(),
                        partition: 0,
                        offset: *offset,
                        timestamp_ms: None,
                        key: None,
                        payload: Some(Bytes::from_static(b"{}")),
                        headers: vec![Header {
                            key: "id".into(),
                            value: Some(Bytes::from(ids.new_id().to_string())),
                        }],
                        header_error: None,
                    }
                })
                .collect();
            decode_batch(raws, "id")
        })
        .collect()
}

/// Batch latencies in microseconds.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// The inbox of the bench's batches (no offsets in the database: the bench has no group).
pub fn inbox(pool: &Pool) -> Inbox<Noop> {
    Inbox::new(pool.clone(), Arc::new(Noop), "id")
}

/// Applies one batch; checks that every id was new. Returns its latency.
pub async fn apply(inbox: &Inbox<Noop>, batch: &Decoded<Nothing>) -> Result<Duration> {
    let started = Instant::now();
    let outcome = inbox
        .apply_batch("bench", 0, batch)
        .await
        .context("the inbox transaction")?;
    if outcome.new != batch.messages.len() as u64 {
        bail!("{} of {} ids were new", outcome.new, batch.messages.len());
    }
    Ok(started.elapsed())
}

/// Percentiles of a latency histogram, in milliseconds.
pub fn percentiles(h: &Histogram<u64>) -> Value {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1_000.0;
    json!({
        "batches": h.len(),
        "p50_ms": ms(0.5),
        "p90_ms": ms(0.9),
        "p99_ms": ms(0.99),
        "max_ms": h.max() as f64 / 1_000.0,
    })
}

/// Current WAL position in bytes.
pub async fn wal_lsn(client: &Object) -> Result<i64> {
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await
        .context("pg_current_wal_lsn")?;
    Ok(row.get(0))
}

//! The inbox transaction: dedup and business change in ONE local transaction.
//!
//! Batched (the product): per batch, in one transaction,
//! 1. later copies of an id inside the batch are dropped (first occurrence wins);
//! 2. one statement inserts the batch's ids (`INSERT … SELECT unnest($1::uuid[]) … ON CONFLICT
//!    (message_id) DO NOTHING RETURNING message_id`), which names the ids that are new; an id
//!    that a concurrent transaction holds is waited for, then skipped if it committed;
//! 3. the handler gets the new messages only, and the same transaction;
//! 4. one statement records the batch's dead letters (bad input and rejections);
//! 5. COMMIT.
//!
//! Per-message (the baseline it is measured against): the same steps, one message per
//! transaction.
//!
//! Invariant: nothing here touches Kafka. The caller stores offsets only after these functions
//! return `Ok`, that is after COMMIT succeeded. A dropped transaction rolls back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Client, Pool};

use crate::error::InboxError;
pub use crate::observe::outcome::{StageTimings, TxOutcome};
use crate::pipeline::dead_letter::RowForm;
pub use crate::pipeline::dead_letter::MAX_DETAIL_BYTES;
use crate::pipeline::handler::Handler;
use crate::pipeline::message::{
    decode_batch_with, reject_outside_window, Decoded, Decoding, IdRules, RawMessage,
};
pub use crate::reason::ReasonCounts;
use crate::source::positions::{OffsetTarget, Written};
use crate::unsafe_controls::UnsafeControls;

/// The statements of a batch's transaction besides the handler's (the dedup insert with and
/// without the position, for a batch and for one message; the dead letters), for [`crate::db::warm`].
pub(crate) const STATEMENTS: [&str; 5] = [
    crate::db::sql::INSERT_IDS_AND_OFFSET,
    crate::db::sql::INSERT_IDS,
    crate::db::sql::INSERT_ONE_ID_AND_OFFSET,
    crate::db::sql::INSERT_ONE_ID,
    crate::db::sql::INSERT_DEAD_LETTERS,
];

mod minimal_rows;
use minimal_rows::refused_rows;
mod poison;
mod transaction;
mod within;
pub(crate) use transaction::{apply_batch, apply_one, last_offset};
pub(crate) use within::apply_within;
#[cfg(feature = "unsafe-controls")]
mod without_inbox;
#[cfg(feature = "unsafe-controls")]
use without_inbox::apply_without_inbox;

/// How messages are grouped into transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// One transaction per micro-batch, one dedup statement per batch.
    #[default]
    Batched,
    /// One transaction per message: the textbook inbox, kept as the baseline.
    PerMessage,
}
crate::names::named!(Mode { Batched = "batched", PerMessage = "per-message" });

/// Runs inbox transactions for one handler.
pub struct Inbox<H: Handler> {
    pool: Pool,
    handler: Arc<H>,
    decoding: Arc<Decoding>,
    offsets_group: Option<Arc<str>>,
    unsafe_controls: UnsafeControls,
    dedup_window: Option<Duration>,
    deadline: Option<Duration>,
    /// The position this member last committed (or started from) per partition it holds, with
    /// offsets in the database: what each offset write compares against.
    positions: Mutex<HashMap<(Arc<str>, i32), i64>>,
}

impl<H: Handler> Inbox<H> {
    /// Closes every idle pooled connection, so that the next transactions open new sessions:
    /// they prepare their statements again (a cached plan whose result type changed, 0A000,
    /// never clears on the statement that saw it; the SQL handler checks its statement's result
    /// columns again) and take the database's and role's settings again (a
    /// `default_transaction_read_only` switched off, 25006).
    pub fn reset_connections(&self) {
        drop(self.pool.retain(|_, _| false));
    }

    /// Gives up on a transaction the database has not answered within twice `timeout` (the
    /// statement timeout of the pool's connections, [`crate::db::ConnectOptions`]): a
    /// black-holed connection, which TCP alone may take minutes to notice behind a proxy.
    /// `None` or zero: no deadline.
    pub fn with_statement_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.deadline = timeout
            .filter(|t| !t.is_zero())
            .map(|t| t.saturating_mul(2));
        self
    }

    /// Runs `transaction` within the deadline ([`Inbox::with_statement_timeout`]).
    async fn bounded<T>(
        &self,
        transaction: impl std::future::Future<Output = Result<T, InboxError>>,
    ) -> Result<T, InboxError> {
        match self.deadline {
            Some(d) => tokio::time::timeout(d, transaction)
                .await
                .unwrap_or(Err(InboxError::TimedOut(d))),
            None => transaction.await,
        }
    }

    /// An inbox over `pool`, reading UUID ids from header `id_header` (see
    /// [`Inbox::with_decoding`] for other rules).
    pub fn new(pool: Pool, handler: Arc<H>, id_header: impl Into<Arc<str>>) -> Self {
        let header: Arc<str> = id_header.into();
        Self {
            pool,
            handler,
            decoding: Arc::new(Decoding::with_ids(IdRules::header(&*header))),
            offsets_group: None,
            unsafe_controls: UnsafeControls::default(),
            dedup_window: None,
            deadline: None,
            positions: Mutex::default(),
        }
    }

    /// Decodes records under `decoding`: where ids come from, which are accepted, what
    /// tombstones and values are.
    pub fn with_decoding(mut self, decoding: Decoding) -> Self {
        self.decoding = Arc::new(decoding);
        self
    }

    /// The rules records are decoded under.
    pub fn decoding(&self) -> &Decoding {
        &self.decoding
    }

    /// Also records each partition's next offset for consumer group `group` in
    /// `consumer_offsets`, in the same transaction as the batch (`None`: Kafka only).
    pub fn with_offsets_in_db(mut self, group: Option<&str>) -> Self {
        self.offsets_group = group.map(Arc::from);
        self
    }

    /// The consumer group whose offsets this inbox records, if it records them.
    pub fn offsets_group(&self) -> Option<&str> {
        self.offsets_group.as_deref()
    }

    fn target<'a, P>(
        &'a self,
        topic: &str,
        partition: i32,
        batch: &Decoded<P>,
        written: &'a Written,
    ) -> Option<OffsetTarget<'a>> {
        let group = self.offsets_group.as_deref()?;
        let last = last_offset(batch)?;
        Some(OffsetTarget {
            group,
            next_offset: last.checked_add(1)?,
            expected: self.position(topic, partition),
            written,
        })
    }

    fn lock_positions(&self) -> std::sync::MutexGuard<'_, HashMap<(Arc<str>, i32), i64>> {
        // A map of plain values is never left half-updated by a panic: recover it.
        self.positions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The position this member holds for a partition (`None`: none known).
    pub(crate) fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        let key: (Arc<str>, i32) = (Arc::from(topic), partition);
        self.lock_positions().get(&key).copied()
    }

    /// Sets the position the next offset write of a partition compares against: where the
    /// assignment started from the database (`None`: no row; the first write may only create
    /// the row or move it forward), or the database's position after a rewind.
    pub(crate) fn hold_position(&self, topic: &str, partition: i32, next_offset: Option<i64>) {
        let key: (Arc<str>, i32) = (Arc::from(topic), partition);
        let mut positions = self.lock_positions();
        match next_offset {
            Some(n) => positions.insert(key, n),
            None => positions.remove(&key),
        };
    }

    /// After a commit: the partition's position is now the one its offset write left, if any.
    fn committed_position(&self, topic: &str, partition: i32, written: &Written) {
        if let Some(next) = written.get() {
            self.hold_position(topic, partition, Some(next));
        }
    }

    /// Moves a partition's stored position forward to `next_offset` alone (past records that
    /// carry no message: a transaction's control records, aborted records), compared-and-set
    /// against the position this member holds, in a transaction of its own.
    pub(crate) async fn advance_position(
        &self,
        topic: &str,
        partition: i32,
        next_offset: i64,
    ) -> Result<(), InboxError> {
        let Some(group) = self.offsets_group.as_deref() else {
            return Ok(());
        };
        let written = Written::default();
        let target = OffsetTarget {
            group,
            next_offset,
            expected: self.position(topic, partition),
            written: &written,
        };
        let mut client = self.pool.get().await?;
        let result = self
            .bounded(async {
                let tx = client.transaction().await?;
                crate::source::positions::store(&tx, topic, partition, target).await?;
                tx.commit().await?;
                Ok(())
            })
            .await;
        discard_if_broken(client, &result);
        if result.is_ok() {
            self.committed_position(topic, partition, &written);
        }
        result
    }

    /// The position the database holds for a partition of the offsets' group (`None`: no row,
    /// or offsets are not kept in the database).
    pub(crate) async fn stored_position(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Option<i64>, InboxError> {
        let Some(group) = self.offsets_group.as_deref() else {
            return Ok(None);
        };
        let partitions = [partition];
        let stored = crate::source::positions::read(&self.pool, group, topic, &partitions);
        Ok(self.bounded(stored).await?.get(&partition).copied())
    }

    /// TEST-ONLY, UNSAFE: with `no_inbox` on, every message is treated as new: the dedup
    /// statement is skipped and the inbox is not written, so redeliveries are applied again.
    pub fn with_unsafe_controls(mut self, controls: UnsafeControls) -> Self {
        self.unsafe_controls = controls;
        self
    }

    /// Turns on the dedup-window guard: UUIDv7 ids older than `window` are dead-lettered
    /// (`outside_dedup_window`) instead of applied; see [`crate::pipeline::message::reject_outside_window`].
    pub fn with_dedup_window(mut self, window: Option<Duration>) -> Self {
        self.dedup_window = window;
        self
    }

    /// Splits a batch into handler messages and dead letters. Done once per batch, before any
    /// attempt, so retries reuse it.
    pub fn decode(&self, batch: Vec<RawMessage>) -> Decoded<H::Payload> {
        let mut decoded = decode_batch_with(batch, &self.decoding);
        if let Some(window) = self.dedup_window {
            let now = std::time::SystemTime::now();
            let oldest = crate::days::before(now, window);
            reject_outside_window(&mut decoded, crate::days::unix_millis(oldest));
        }
        decoded
    }

    /// Applies one decoded batch of one partition in one transaction.
    pub async fn apply_batch(
        &self,
        topic: &str,
        partition: i32,
        batch: &Decoded<H::Payload>,
    ) -> Result<TxOutcome, InboxError> {
        self.apply(topic, partition, batch, Shape::Batch).await
    }

    /// Applies one record in its own transaction (the per-message baseline).
    pub async fn apply_one(
        &self,
        topic: &str,
        partition: i32,
        record: &Decoded<H::Payload>,
    ) -> Result<TxOutcome, InboxError> {
        self.apply(topic, partition, record, Shape::One).await
    }

    /// [`Inbox::apply_batch`] or [`Inbox::apply_one`]: once with the full dead-letter rows, and
    /// again with minimal ones when the database refused the full rows (module `minimal_rows`).
    async fn apply(
        &self,
        topic: &str,
        partition: i32,
        decoded: &Decoded<H::Payload>,
        shape: Shape,
    ) -> Result<TxOutcome, InboxError> {
        let full = self
            .apply_as(topic, partition, decoded, self.rows(None), shape)
            .await;
        let Some(state) = refused_rows(&full, topic, partition) else {
            return full;
        };
        let rows = self.rows(Some(&state));
        self.apply_as(topic, partition, decoded, rows, shape).await
    }

    /// Records the messages of `part` as poison, without calling the handler: their ids go to
    /// the inbox (so a redelivery is a duplicate, not a new failure) and each new one gets a
    /// `handler_error` dead letter with `error` as detail, in one transaction that also writes
    /// the part's undecodable records and its next offset.
    pub async fn dead_letter_poison(
        &self,
        topic: &str,
        partition: i32,
        part: &Decoded<H::Payload>,
        error: &str,
    ) -> Result<TxOutcome, InboxError> {
        let full = self
            .poison_as(topic, partition, part, error, self.rows(None))
            .await;
        let Some(state) = refused_rows(&full, topic, partition) else {
            return full;
        };
        let rows = self.rows(Some(&state));
        self.poison_as(topic, partition, part, error, rows).await
    }

    /// One transaction of `decoded` in `shape`, with dead-letter rows of `rows`; the position it
    /// wrote becomes the partition's once it committed.
    async fn apply_as(
        &self,
        topic: &str,
        partition: i32,
        decoded: &Decoded<H::Payload>,
        rows: RowForm<'_>,
        shape: Shape,
    ) -> Result<TxOutcome, InboxError> {
        let mut client = self.pool.get().await?;
        let written = Written::default();
        let target = self.target(topic, partition, decoded, &written);
        let handler = self.handler.as_ref();
        let at = (topic, partition);
        let result = self
            .bounded(async {
                match (self.unsafe_controls.no_inbox(), shape) {
                    #[cfg(feature = "unsafe-controls")]
                    (true, _) => {
                        apply_without_inbox(&mut client, handler, at, decoded, target, rows).await
                    }
                    (_, Shape::Batch) => {
                        apply_batch(&mut client, handler, at, decoded, target, rows).await
                    }
                    (_, Shape::One) => {
                        apply_one(&mut client, handler, at, decoded, target, rows).await
                    }
                }
            })
            .await;
        discard_if_broken(client, &result);
        if result.is_ok() {
            self.committed_position(topic, partition, &written);
        }
        result
    }

    /// [`Inbox::dead_letter_poison`] with dead-letter rows of `rows` (module `minimal_rows`).
    async fn poison_as(
        &self,
        topic: &str,
        partition: i32,
        part: &Decoded<H::Payload>,
        error: &str,
        rows: RowForm<'_>,
    ) -> Result<TxOutcome, InboxError> {
        let mut client = self.pool.get().await?;
        let written = Written::default();
        let target = self.target(topic, partition, part, &written);
        let result =
            poison::dead_letter_poison(&mut client, (topic, partition), part, error, target, rows)
                .await;
        discard_if_broken(client, &result);
        if result.is_ok() {
            self.committed_position(topic, partition, &written);
        }
        result
    }
}

/// Takes a connection whose transaction failed in a way that may have broken it (closed, or
/// the server ended the session) out of the pool. The server's error can arrive before the
/// client sees the socket close, so the pool's own check could hand the same dead connection
/// to the retry.
fn discard_if_broken<T>(client: Client, result: &Result<T, InboxError>) {
    if result.as_ref().is_err_and(InboxError::breaks_connection) {
        drop(deadpool_postgres::Object::take(client));
    }
}
/// How a transaction takes its records: a batch (dedup with one statement), or one record
/// (the per-message baseline).
#[derive(Debug, Clone, Copy)]
enum Shape {
    Batch,
    One,
}

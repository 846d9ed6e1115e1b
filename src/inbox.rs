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

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Client, Pool};
use uuid::Uuid;

use crate::db::Transaction;
use crate::dead_letter::{self, RowForm};
use crate::error::{HandlerError, InboxError};
use crate::failpoint::failpoint;
use crate::handler::{Handler, Rejection};
use crate::message::DeadLetter;
use crate::message::{
    decode_batch, dedup_in_batch, reject_outside_window, Decoded, Message, RawMessage,
};
use crate::offset_table::{self, OffsetTarget};
pub use crate::outcome::{StageTimings, TxOutcome};
use crate::reason::ReasonCounts;
use crate::sql::{INSERT_IDS, INSERT_IDS_AND_OFFSET, INSERT_ONE_ID, INSERT_ONE_ID_AND_OFFSET};
use crate::unsafe_controls::UnsafeControls;

mod refused;
mod variants;
mod within;
pub use within::{apply_within, Applied};
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
    id_header: Arc<str>,
    offsets_group: Option<Arc<str>>,
    unsafe_controls: UnsafeControls,
    dedup_window: Option<Duration>,
    deadline: Option<Duration>,
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

    /// An inbox over `pool`, reading ids from header `id_header`.
    pub fn new(pool: Pool, handler: Arc<H>, id_header: impl Into<Arc<str>>) -> Self {
        Self {
            pool,
            handler,
            id_header: id_header.into(),
            offsets_group: None,
            unsafe_controls: UnsafeControls::default(),
            dedup_window: None,
            deadline: None,
        }
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

    fn target<P>(&self, batch: &Decoded<P>) -> Option<OffsetTarget<'_>> {
        let group = self.offsets_group.as_deref()?;
        let last = last_offset(batch)?;
        Some(OffsetTarget {
            group,
            next_offset: last.checked_add(1)?,
        })
    }

    /// TEST-ONLY, UNSAFE: with `no_inbox` on, every message is treated as new: the dedup
    /// statement is skipped and the inbox is not written, so redeliveries are applied again.
    pub fn with_unsafe_controls(mut self, controls: UnsafeControls) -> Self {
        self.unsafe_controls = controls;
        self
    }

    /// Turns on the dedup-window guard: UUIDv7 ids older than `window` are dead-lettered
    /// (`outside_dedup_window`) instead of applied; see [`crate::message::reject_outside_window`].
    pub fn with_dedup_window(mut self, window: Option<Duration>) -> Self {
        self.dedup_window = window;
        self
    }

    /// Splits a batch into handler messages and dead letters. Done once per batch, before any
    /// attempt, so retries reuse it.
    pub fn decode(&self, batch: Vec<RawMessage>) -> Decoded<H::Payload> {
        let mut decoded = decode_batch(batch, &self.id_header);
        if let Some(window) = self.dedup_window {
            let now = std::time::SystemTime::now();
            let oldest = crate::days::before(now, window);
            reject_outside_window(&mut decoded, crate::days::unix_millis(oldest));
        }
        decoded
    }

    /// [`Inbox::apply_batch`] with dead-letter rows of `rows` (module `refused`).
    async fn apply_batch_as(
        &self,
        topic: &str,
        partition: i32,
        batch: &Decoded<H::Payload>,
        rows: RowForm<'_>,
    ) -> Result<TxOutcome, InboxError> {
        let mut client = self.pool.get().await?;
        let (handler, target) = (self.handler.as_ref(), self.target(batch));
        let at = (topic, partition);
        let result = self
            .bounded(async {
                match self.unsafe_controls.no_inbox() {
                    #[cfg(feature = "unsafe-controls")]
                    true => {
                        apply_without_inbox(&mut client, handler, at, batch, target, rows).await
                    }
                    _ => apply_batch(&mut client, handler, at, batch, target, rows).await,
                }
            })
            .await;
        discard_if_broken(client, &result);
        result
    }

    /// [`Inbox::apply_one`] with dead-letter rows of `rows` (module `refused`).
    async fn apply_one_as(
        &self,
        topic: &str,
        partition: i32,
        record: &Decoded<H::Payload>,
        rows: RowForm<'_>,
    ) -> Result<TxOutcome, InboxError> {
        let mut client = self.pool.get().await?;
        let (handler, target) = (self.handler.as_ref(), self.target(record));
        let at = (topic, partition);
        let result = self
            .bounded(async {
                match self.unsafe_controls.no_inbox() {
                    #[cfg(feature = "unsafe-controls")]
                    true => {
                        apply_without_inbox(&mut client, handler, at, record, target, rows).await
                    }
                    _ => apply_one(&mut client, handler, at, record, target, rows).await,
                }
            })
            .await;
        discard_if_broken(client, &result);
        result
    }

    /// [`Inbox::dead_letter_poison`] with dead-letter rows of `rows` (module `refused`).
    async fn poison_as(
        &self,
        topic: &str,
        partition: i32,
        part: &Decoded<H::Payload>,
        error: &str,
        rows: RowForm<'_>,
    ) -> Result<TxOutcome, InboxError> {
        let mut client = self.pool.get().await?;
        let target = self.target(part);
        let result = variants::dead_letter_poison(
            &mut client,
            (topic, partition),
            part,
            error,
            target,
            rows,
        )
        .await;
        discard_if_broken(client, &result);
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

/// The batched inbox transaction over an explicit connection; with a `target`, it also records
/// the partition's next offset. Dead letters are written as rows of `rows`.
pub async fn apply_batch<H: Handler>(
    client: &mut Client,
    handler: &H,
    (topic, partition): (&str, i32),
    batch: &Decoded<H::Payload>,
    target: Option<OffsetTarget<'_>>,
    rows: RowForm<'_>,
) -> Result<TxOutcome, InboxError> {
    let received = (batch.messages.len() + batch.dead_letters.len()) as u64;
    let mut unique: Vec<&Message<H::Payload>> = batch.messages.iter().collect();
    dedup_in_batch(&mut unique, |m| m.id);

    let mut timings = StageTimings::default();
    let tx = client.transaction().await?;
    let mut clock = Instant::now();
    let new_ids = insert_ids(&tx, (topic, partition), &unique, target).await?;
    timings.dedup = lap(&mut clock);
    let fresh: Vec<Message<H::Payload>> = unique
        .into_iter()
        .filter(|m| new_ids.contains(&m.id))
        .cloned()
        .collect();
    // One new message takes the handler's one-message path (the per-message baseline's
    // statements), in the same transaction shape.
    let rejections = match fresh.as_slice() {
        [only] => handler.handle_one(&tx, only).await?.into_iter().collect(),
        _ => handler.handle(&tx, &fresh).await?,
    };
    timings.handler = lap(&mut clock);

    let mut letters = batch.dead_letters.clone();
    for r in &rejections {
        letters.push(rejected_letter(&fresh, r)?);
    }
    let written = dead_letter::insert(&tx, topic, partition, &letters, rows)
        .await
        .map_err(InboxError::DeadLetters)?;
    timings.dead_letters = lap(&mut clock);
    failpoint!("before_commit");
    tx.commit().await?;
    timings.commit = lap(&mut clock);

    Ok(TxOutcome {
        received,
        new: fresh.len() as u64,
        duplicates: (batch.messages.len() - fresh.len()) as u64,
        rejected: rejections.len() as u64,
        poisoned: 0,
        invalid: batch.dead_letters.len() as u64,
        dead_letters_written: written,
        dead_letter_reasons: ReasonCounts::of(letters.iter().map(|l| &l.reason)),
        timings,
    })
}

/// The highest offset of a decoded batch's records.
pub fn last_offset<P>(batch: &Decoded<P>) -> Option<i64> {
    let a = batch.messages.iter().map(|m| m.raw.offset);
    let b = batch.dead_letters.iter().map(|l| l.raw.offset);
    a.chain(b).max()
}

fn lap(clock: &mut Instant) -> Duration {
    let now = Instant::now();
    let d = now - *clock;
    *clock = now;
    d
}

/// The per-message inbox transaction: `record` holds exactly one decoded record; with a
/// `target`, it also records the partition's next offset. Dead letters are written as rows of
/// `rows`.
pub async fn apply_one<H: Handler>(
    client: &mut Client,
    handler: &H,
    (topic, partition): (&str, i32),
    record: &Decoded<H::Payload>,
    target: Option<OffsetTarget<'_>>,
    rows: RowForm<'_>,
) -> Result<TxOutcome, InboxError> {
    let tx = client.transaction().await?;
    let mut clock = Instant::now();
    let mut outcome = TxOutcome {
        received: 1,
        invalid: record.dead_letters.len() as u64,
        ..TxOutcome::default()
    };
    let mut letters = record.dead_letters.clone();
    if let Some(message) = record.messages.first() {
        let at = (topic, partition);
        let new = insert_one_id(&tx, at, message.id, message.raw.offset, target).await?;
        outcome.timings.dedup = lap(&mut clock);
        if !new.is_empty() {
            outcome.new = 1;
            if let Some(rejection) = handler.handle_one(&tx, message).await? {
                outcome.rejected = 1;
                letters.push(rejected_letter(std::slice::from_ref(message), &rejection)?);
            }
        } else {
            outcome.duplicates = 1;
        }
        outcome.timings.handler = lap(&mut clock);
    } else if let Some(t) = target {
        offset_table::store(&tx, topic, partition, t).await?;
    }
    outcome.dead_letters_written = dead_letter::insert(&tx, topic, partition, &letters, rows)
        .await
        .map_err(InboxError::DeadLetters)?;
    outcome.dead_letter_reasons = ReasonCounts::of(letters.iter().map(|l| &l.reason));
    outcome.timings.dead_letters = lap(&mut clock);
    failpoint!("before_commit");
    tx.commit().await?;
    outcome.timings.commit = lap(&mut clock);
    Ok(outcome)
}

/// Inserts the ids, returns those that were new; also records `target` when given (in the same
/// statement, or alone when there are no ids).
async fn insert_ids<P>(
    tx: &Transaction<'_>,
    (topic, partition): (&str, i32),
    messages: &[&Message<P>],
    target: Option<OffsetTarget<'_>>,
) -> Result<HashSet<Uuid>, InboxError> {
    if messages.is_empty() {
        if let Some(t) = target {
            offset_table::store(tx, topic, partition, t).await?;
        }
        return Ok(HashSet::new());
    }
    // Insert in id order: two transactions inserting overlapping ids then wait on each other in
    // the same order and cannot deadlock. (Ids are unique here: in-batch copies are gone.)
    let mut pairs: Vec<(Uuid, i64)> = messages.iter().map(|m| (m.id, m.raw.offset)).collect();
    pairs.sort_unstable();
    if let [(id, offset)] = pairs[..] {
        return insert_one_id(tx, (topic, partition), id, offset, target).await;
    }
    let (ids, offsets): (Vec<Uuid>, Vec<i64>) = pairs.into_iter().unzip();
    let rows = match target {
        None => {
            let stmt = tx.prepare_cached(INSERT_IDS).await?;
            tx.query(&stmt, &[&ids, &topic, &partition, &offsets])
                .await?
        }
        Some(t) => {
            let stmt = tx.prepare_cached(INSERT_IDS_AND_OFFSET).await?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                [&ids, &topic, &partition, &offsets, &t.group, &t.next_offset];
            tx.query(&stmt, &params).await?
        }
    };
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// [`insert_ids`] of one id, with the per-message statement (one row, no arrays).
async fn insert_one_id(
    tx: &Transaction<'_>,
    (topic, partition): (&str, i32),
    id: Uuid,
    offset: i64,
    target: Option<OffsetTarget<'_>>,
) -> Result<HashSet<Uuid>, InboxError> {
    let row = match target {
        None => {
            let stmt = tx.prepare_cached(INSERT_ONE_ID).await?;
            tx.query_opt(&stmt, &[&id, &topic, &partition, &offset])
                .await?
        }
        Some(t) => {
            let stmt = tx.prepare_cached(INSERT_ONE_ID_AND_OFFSET).await?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                [&id, &topic, &partition, &offset, &t.group, &t.next_offset];
            tx.query_opt(&stmt, &params).await?
        }
    };
    Ok(row.map(|r| r.get(0)).into_iter().collect())
}

/// The dead letter of `rejection`. An index outside the handler's slice is the handler's bug,
/// never a message dropped in silence: the transaction fails for the environment, so the
/// partition stalls (nothing committed) until a fixed handler runs.
fn rejected_letter<P>(
    messages: &[Message<P>],
    rejection: &Rejection,
) -> Result<DeadLetter, InboxError> {
    let message = messages.get(rejection.index).ok_or_else(|| {
        InboxError::Handler(HandlerError::Environment(
            format!(
                "the handler rejected message {} of a slice of {}",
                rejection.index,
                messages.len()
            )
            .into(),
        ))
    })?;
    Ok(DeadLetter::new(
        message.raw.clone(),
        Some(message.id.to_string()),
        rejection.reason.clone(),
        rejection.detail.clone(),
    ))
}

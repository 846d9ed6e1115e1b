//! The inbox transactions over an explicit connection, statement by statement: the batched one
//! (the product), the per-message one (the baseline), and the dedup insert and rejection checks
//! they share with the poison and redrive paths.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use deadpool_postgres::Client;
use uuid::Uuid;

use crate::db::sql::{INSERT_IDS, INSERT_IDS_AND_OFFSET, INSERT_ONE_ID, INSERT_ONE_ID_AND_OFFSET};
use crate::db::Transaction;
use crate::error::{HandlerError, InboxError};
use crate::failpoint::failpoint;
use crate::observe::outcome::{StageTimings, TxOutcome};
use crate::pipeline::dead_letter::{self, RowForm};
use crate::pipeline::handler::{Handler, Rejection};
use crate::pipeline::message::{dedup_in_batch, DeadLetter, Decoded, Message};
use crate::reason::ReasonCounts;
use crate::source::positions::{self, OffsetTarget};

/// The batched inbox transaction over an explicit connection; with a `target`, it also records
/// the partition's next offset. Dead letters are written as rows of `rows`.
pub(crate) async fn apply_batch<H: Handler>(
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
pub(crate) fn last_offset<P>(batch: &Decoded<P>) -> Option<i64> {
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
pub(crate) async fn apply_one<H: Handler>(
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
        positions::store(&tx, topic, partition, t).await?;
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
pub(super) async fn insert_ids<P>(
    tx: &Transaction<'_>,
    (topic, partition): (&str, i32),
    messages: &[&Message<P>],
    target: Option<OffsetTarget<'_>>,
) -> Result<HashSet<Uuid>, InboxError> {
    if messages.is_empty() {
        if let Some(t) = target {
            positions::store(tx, topic, partition, t).await?;
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
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
                &ids,
                &topic,
                &partition,
                &offsets,
                &t.group,
                &t.next_offset,
                &t.expected,
            ];
            tx.query(&stmt, &params).await?
        }
    };
    ids_written(&rows, target)
}

/// The new ids of a dedup statement's rows; with a `target`, the last row holds the position the
/// offset's compare-and-set stored, NULL when it wrote nothing
/// ([`crate::db::sql::INSERT_IDS_AND_OFFSET`]).
fn ids_written(
    rows: &[tokio_postgres::Row],
    target: Option<OffsetTarget<'_>>,
) -> Result<HashSet<Uuid>, InboxError> {
    let mut ids = HashSet::with_capacity(rows.len());
    let mut stored = None;
    for row in rows {
        match row.get::<_, Option<Uuid>>(0) {
            Some(id) => {
                ids.insert(id);
            }
            None => stored = Some(row.get::<_, Option<i64>>(1)),
        }
    }
    if let Some(t) = target {
        t.check(stored.flatten())?;
    }
    Ok(ids)
}

/// [`insert_ids`] of one id, with the per-message statement (one row, no arrays).
async fn insert_one_id(
    tx: &Transaction<'_>,
    (topic, partition): (&str, i32),
    id: Uuid,
    offset: i64,
    target: Option<OffsetTarget<'_>>,
) -> Result<HashSet<Uuid>, InboxError> {
    let rows = match target {
        None => {
            let stmt = tx.prepare_cached(INSERT_ONE_ID).await?;
            tx.query(&stmt, &[&id, &topic, &partition, &offset]).await?
        }
        Some(t) => {
            let stmt = tx.prepare_cached(INSERT_ONE_ID_AND_OFFSET).await?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
                &id,
                &topic,
                &partition,
                &offset,
                &t.group,
                &t.next_offset,
                &t.expected,
            ];
            tx.query(&stmt, &params).await?
        }
    };
    ids_written(&rows, target)
}

/// The dead letter of `rejection`. An index outside the handler's slice is the handler's bug,
/// never a message dropped in silence: the transaction fails for the environment, so the
/// partition stalls (nothing committed) until a fixed handler runs.
pub(super) fn rejected_letter<P>(
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

//! One redrive transaction: lock, decode, remove the dead letters' own inbox rows (those of
//! `handler_error` and rejections, the only dead letters that write one), dedup and handler,
//! mark, COMMIT (the steps of the parent module's documentation).
//!
//! Invariant: the dead letters are locked before anything else and stay locked until COMMIT or
//! rollback; every other statement touches only what belongs to them (their inbox rows, their
//! marks) or what the handler does, so a failure anywhere changes nothing.

use std::collections::HashSet;
use std::sync::Arc;

use deadpool_postgres::{Client, Pool};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{Selection, NOT_BY_DEFAULT};
use crate::db::sql::redrive::{DELETE_OWN_INBOX_ROWS, LOCK_ONE, LOCK_PARKED, MARK};
use crate::db::Transaction;
use crate::error::InboxError;
use crate::failpoint::failpoint;
use crate::pipeline::dead_letter::{storable_detail, Parked, Position};
use crate::pipeline::handler::Handler;
use crate::pipeline::inbox::apply_within;
use crate::pipeline::message::{decode_batch_with, Decoded, Decoding, Message, RawMessage};
use crate::reason::Reason;

/// Which dead letters a transaction locks.
#[derive(Debug, Clone, Copy)]
pub(super) enum Lock<'a> {
    /// The next batch of the selection after a position.
    Next {
        selection: &'a Selection,
        after: Option<&'a Position>,
    },
    /// One dead letter (after its batch failed with a message's fault).
    One(&'a Position),
}

/// A committed redrive transaction.
pub(super) struct Done {
    /// The dead letters it locked, in key order (none: nothing was left to select).
    pub(super) positions: Vec<Position>,
    pub(super) report: super::RedriveReport,
}

/// A failed one, rolled back: the error and the dead letters it had locked.
pub(super) struct Failed {
    pub(super) error: InboxError,
    pub(super) positions: Vec<Position>,
}

impl Failed {
    pub(super) fn new(error: InboxError, positions: Vec<Position>) -> Self {
        Self { error, positions }
    }

    pub(super) fn at(error: InboxError, position: &Position) -> Self {
        Self::new(error, vec![position.clone()])
    }
}

/// The parameters of the parked-dead-letter filter (`crate::db::sql::redrive`).
pub(super) struct Params<'a> {
    reasons: &'a [String],
    excluded: Vec<&'static str>,
    topic: Option<&'a str>,
    ids: &'a [String],
    after: (Option<&'a str>, Option<i32>, Option<i64>),
    limit: i64,
}

impl<'a> Params<'a> {
    pub(super) fn new(selection: &'a Selection, after: Option<&'a Position>) -> Self {
        Self {
            reasons: &selection.reasons,
            excluded: NOT_BY_DEFAULT.iter().map(|r| r.as_str()).collect(),
            topic: selection.topic.as_deref(),
            ids: &selection.ids,
            after: (
                after.map(|p| p.topic.as_str()),
                after.map(|p| p.partition),
                after.map(|p| p.offset),
            ),
            limit: i64::try_from(selection.batch_size.get()).unwrap_or(i64::MAX),
        }
    }

    pub(super) fn as_sql(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.reasons,
            &self.excluded,
            &self.topic,
            &self.ids,
            &self.after.0,
            &self.after.1,
            &self.after.2,
            &self.limit,
        ]
    }
}

/// What a redrive did with one dead letter.
enum Outcome {
    Applied,
    Duplicate,
    Rejected(String),
    FailedDecoding(String),
}

/// Runs one redrive transaction on `client`.
pub(super) async fn run<H: Handler>(
    client: &mut Client,
    handler: &H,
    decoding: &Decoding,
    lock: Lock<'_>,
) -> Result<Done, Failed> {
    let fail = |positions: &[Position]| {
        let positions = positions.to_vec();
        move |e: InboxError| Failed::new(e, positions)
    };
    let tx = client
        .transaction()
        .await
        .map_err(|e| fail(&[])(e.into()))?;
    let parked = lock_parked(&tx, lock).await.map_err(fail(&[]))?;
    let positions: Vec<Position> = parked.iter().map(Parked::position).collect();
    if parked.is_empty() {
        return Ok(Done {
            positions,
            report: Default::default(),
        });
    }
    let outcomes = apply(&tx, handler, decoding, &parked)
        .await
        .map_err(fail(&positions))?;
    let report = mark(&tx, &outcomes).await.map_err(fail(&positions))?;
    failpoint!("redrive_before_commit");
    tx.commit().await.map_err(|e| fail(&positions)(e.into()))?;
    Ok(Done { positions, report })
}

async fn lock_parked(tx: &Transaction<'_>, lock: Lock<'_>) -> Result<Vec<Parked>, InboxError> {
    let rows = match lock {
        Lock::Next { selection, after } => {
            let params = Params::new(selection, after);
            let stmt = tx.prepare_cached(LOCK_PARKED).await?;
            tx.query(&stmt, &params.as_sql()).await?
        }
        Lock::One(p) => {
            let stmt = tx.prepare_cached(LOCK_ONE).await?;
            tx.query(&stmt, &[&p.topic, &p.partition, &p.offset])
                .await?
        }
    };
    let parked: Result<Vec<Parked>, _> = rows.iter().map(Parked::from_row).collect();
    Ok(parked?)
}

/// Decodes the parked records, removes their own inbox rows, and applies the new ones; returns
/// each dead letter's outcome.
async fn apply<H: Handler>(
    tx: &Transaction<'_>,
    handler: &H,
    decoding: &Decoding,
    parked: &[Parked],
) -> Result<Vec<(Position, Outcome)>, InboxError> {
    let raws: Vec<RawMessage> = parked.iter().map(|p| (*p.raw).clone()).collect();
    let decoded: Decoded<H::Payload> = decode_batch_with(raws, decoding);
    delete_own_inbox_rows(tx, &decoded.messages).await?;
    let applied = apply_within(tx, handler, &decoded.messages).await?;
    let key = |raw: &Arc<RawMessage>| (raw.topic.clone(), raw.partition, raw.offset);
    let fresh: HashSet<_> = applied.fresh.iter().map(|m| key(&m.raw)).collect();
    // Indexes into `fresh`, checked by `apply_within`.
    let mut rejected: Vec<_> = applied
        .rejections
        .iter()
        .filter_map(|r| {
            let m = applied.fresh.get(r.index)?;
            Some((key(&m.raw), format!("{}: {}", r.reason, r.detail)))
        })
        .collect();
    let mut outcomes = Vec::with_capacity(parked.len());
    for m in &decoded.messages {
        let at = key(&m.raw);
        let outcome = match rejected.iter().position(|(k, _)| *k == at) {
            Some(i) => Outcome::Rejected(rejected.swap_remove(i).1),
            None if fresh.contains(&at) => Outcome::Applied,
            None => Outcome::Duplicate,
        };
        outcomes.push((position_of(&m.raw), outcome));
    }
    for l in &decoded.dead_letters {
        let detail = format!("failed decoding again: {}: {}", l.reason, l.detail);
        outcomes.push((position_of(&l.raw), Outcome::FailedDecoding(detail)));
    }
    Ok(outcomes)
}

fn position_of(raw: &RawMessage) -> Position {
    Position {
        topic: raw.topic.to_string(),
        partition: raw.partition,
        offset: raw.offset,
    }
}

/// The reasons whose dead letters wrote no inbox row: every pipeline reason but
/// `handler_error` (a poison message's id goes to the inbox with its dead letter, and so does a
/// handler's rejection). A decoding failure never reached the inbox; an `outside_dedup_window`
/// dead letter is a re-read held back by the guard, and the row at its position, if any, is the
/// original application's, which a redrive must keep.
fn without_own_inbox_row() -> Vec<&'static str> {
    Reason::PIPELINE
        .iter()
        .filter(|r| **r != Reason::HandlerError)
        .map(Reason::as_str)
        .collect()
}

async fn delete_own_inbox_rows<P>(
    tx: &Transaction<'_>,
    messages: &[Message<P>],
) -> Result<(), InboxError> {
    if messages.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = messages.iter().map(|m| m.id).collect();
    let topics: Vec<&str> = messages.iter().map(|m| &*m.raw.topic).collect();
    let partitions: Vec<i32> = messages.iter().map(|m| m.raw.partition).collect();
    let offsets: Vec<i64> = messages.iter().map(|m| m.raw.offset).collect();
    let kept = without_own_inbox_row();
    let stmt = tx.prepare_cached(DELETE_OWN_INBOX_ROWS).await?;
    tx.execute(&stmt, &[&ids, &topics, &partitions, &offsets, &kept])
        .await?;
    Ok(())
}

/// Writes every outcome in one statement; returns the counts.
async fn mark(
    tx: &Transaction<'_>,
    outcomes: &[(Position, Outcome)],
) -> Result<super::RedriveReport, InboxError> {
    let mut report = super::RedriveReport::default();
    let mut rows = Marks::default();
    for (p, outcome) in outcomes {
        let (state, detail) = match outcome {
            Outcome::Applied => (Some("applied"), None),
            Outcome::Duplicate => (Some("duplicate"), None),
            Outcome::Rejected(d) => (Some("rejected"), Some(storable_detail(d))),
            Outcome::FailedDecoding(d) => (None, Some(storable_detail(d))),
        };
        match outcome {
            Outcome::Applied => report.applied += 1,
            Outcome::Duplicate => report.duplicate += 1,
            Outcome::Rejected(_) => report.rejected += 1,
            Outcome::FailedDecoding(_) => report.failed_decoding += 1,
        }
        rows.push(p, state, detail);
    }
    rows.write(tx).await?;
    Ok(report)
}

/// The columns of [`MARK`].
#[derive(Default)]
struct Marks<'a> {
    topics: Vec<&'a str>,
    partitions: Vec<i32>,
    offsets: Vec<i64>,
    outcomes: Vec<Option<&'static str>>,
    details: Vec<Option<String>>,
}

impl<'a> Marks<'a> {
    fn push(&mut self, p: &'a Position, outcome: Option<&'static str>, detail: Option<String>) {
        self.topics.push(&p.topic);
        self.partitions.push(p.partition);
        self.offsets.push(p.offset);
        self.outcomes.push(outcome);
        self.details.push(detail);
    }

    async fn write(&self, tx: &Transaction<'_>) -> Result<u64, InboxError> {
        let stmt = tx.prepare_cached(MARK).await?;
        let params: [&(dyn ToSql + Sync); 5] = [
            &self.topics,
            &self.partitions,
            &self.offsets,
            &self.outcomes,
            &self.details,
        ];
        Ok(tx.execute(&stmt, &params).await?)
    }
}

/// Keeps a dead letter that failed again alone parked: `detail` becomes the new error and its
/// attempts grow by one, unless another redrive has applied it meanwhile.
pub(super) async fn mark_failed(
    pool: &Pool,
    position: &Position,
    detail: &str,
) -> Result<(), InboxError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let mut rows = Marks::default();
    rows.push(position, None, Some(storable_detail(detail)));
    rows.write(&tx).await?;
    tx.commit().await?;
    Ok(())
}

//! Re-driving dead letters: a dead letter is a parking place, not a grave. Once the cause is
//! fixed (a constraint dropped, a handler corrected), `redrive` applies the parked messages
//! through the handler, exactly once, and marks each dead letter with what happened to it; it
//! never deletes one.
//!
//! Per batch of dead letters, in one transaction (module `batch`):
//! 1. lock the next parked dead letters of the [`Selection`] in key order, skipping those
//!    another redrive holds (`FOR UPDATE SKIP LOCKED`), so two redrives never apply a message
//!    twice and never wait on each other;
//! 2. decode their records again, exactly as stored (key, value, headers, Kafka timestamp);
//! 3. remove the inbox rows that the dead letters put there themselves (same id, same
//!    position, and a reason that writes one: `handler_error` or a handler's rejection): a
//!    parked message is not its own duplicate, while a copy applied meanwhile under another
//!    position keeps its row, and so does the original application of an
//!    `outside_dedup_window` re-read: the message is then a `duplicate`;
//! 4. the inbox's own dedup and the handler, on the new messages only, in this transaction
//!    (`pipeline::inbox::apply_within`);
//! 5. mark each dead letter: `applied`, `duplicate` or `rejected` (`redriven_at = now()`), or,
//!    when it fails decoding again, a new detail and one more attempt; then COMMIT.
//!
//! Invariants: everything a batch does commits together or not at all, so a kill at any instant
//! leaves each dead letter either parked with nothing of it applied, or marked with its effect
//! committed; a second redrive selects only what is still parked. A failure that is the
//! message's fault rolls the batch back and re-drives its dead letters one per transaction: the
//! failing one stays parked, with the new error as detail and one more attempt. Any other
//! failure (the environment's, or a transient one that outlasts the retries) stops the redrive
//! with the batch rolled back: batches committed before it stay committed.

use std::num::NonZeroUsize;
use std::time::Duration;

use deadpool_postgres::Pool;

use crate::db::sql::redrive::{LIST, PREVIEW_PARKED};
use crate::error::InboxError;
use crate::fault::Fault;
use crate::one_line::chain;
pub use crate::pipeline::dead_letter::stored::table;
pub use crate::pipeline::dead_letter::{Listed, Position};
use crate::pipeline::handler::Handler;
use crate::pipeline::message::{Decoding, IdRules};
use crate::reason::Reason;

mod batch;

use batch::{Failed, Lock};

/// Reasons a redrive selects only when [`Selection::reasons`] names them: the decoding failures
/// (their records go through decoding again, which fails again unless the decoding changed),
/// and `outside_dedup_window` (re-driving those bypasses the dedup-window guard: the inbox may
/// no longer hold their ids).
pub const NOT_BY_DEFAULT: [Reason; 5] = [
    Reason::MissingId,
    Reason::InvalidId,
    Reason::EmptyPayload,
    Reason::InvalidPayload,
    Reason::OutsideDedupWindow,
];

/// Dead letters per redrive transaction by default.
pub const DEFAULT_BATCH_SIZE: usize = 500;

/// Which parked dead letters (`redriven_at` NULL) a redrive takes, and how.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Reasons (stored texts) to select; empty: every reason but [`NOT_BY_DEFAULT`].
    pub reasons: Vec<String>,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only these ids, as stored in `message_id` (any text, not only UUIDs); empty: any.
    pub ids: Vec<String>,
    /// How the records are decoded: their ids, tombstones and values (as for `run`).
    pub decoding: Decoding,
    /// Dead letters per transaction.
    pub batch_size: NonZeroUsize,
}

impl Selection {
    /// Every parked dead letter but [`NOT_BY_DEFAULT`]'s, UUID ids read from header
    /// `id_header` (set [`Selection::decoding`] for other rules).
    pub fn new(id_header: impl Into<String>) -> Self {
        Self {
            reasons: Vec::new(),
            topic: None,
            ids: Vec::new(),
            decoding: Decoding::with_ids(IdRules::header(id_header)),
            batch_size: NonZeroUsize::new(DEFAULT_BATCH_SIZE).expect("500 is not zero"),
        }
    }
}

/// What a redrive did, per outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedriveReport {
    /// Applied by the handler (marked `applied`).
    pub applied: u64,
    /// Already applied under another position, or a copy earlier in the redrive (`duplicate`).
    pub duplicate: u64,
    /// Refused by the handler for a business reason (`rejected`, its reason in `detail`).
    pub rejected: u64,
    /// Failed again with the message's fault: still parked, new error in `detail`.
    pub failed_again: u64,
    /// Failed decoding again: still parked, the decoding error in `detail`.
    pub failed_decoding: u64,
}

impl RedriveReport {
    fn add(&mut self, other: &RedriveReport) {
        self.applied += other.applied;
        self.duplicate += other.duplicate;
        self.rejected += other.rejected;
        self.failed_again += other.failed_again;
        self.failed_decoding += other.failed_decoding;
    }
}

impl std::fmt::Display for RedriveReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "re-driven: applied {} duplicate {} rejected {}; still parked: failed again {} \
             failed decoding again {}",
            self.applied, self.duplicate, self.rejected, self.failed_again, self.failed_decoding
        )
    }
}

/// Why a redrive or a listing stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// A batch failed for a reason that is not a message's (or transiently, beyond the
    /// retries); it was rolled back, and the batches before it stay committed.
    #[error("redrive stopped at the dead letters from {from}, nothing of that batch changed: {}", chain(.source))]
    Batch {
        /// The first position of the failed batch (or the last one committed before it).
        from: String,
        /// The failure.
        source: InboxError,
    },
    /// Reading the dead letters failed.
    #[error("cannot read the dead letters: {}", chain(.0))]
    Read(InboxError),
}

impl RedriveError {
    /// Whether running the redrive again soon may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            RedriveError::Batch { source, .. } | RedriveError::Read(source) => {
                source.is_retryable()
            }
        }
    }
}

/// Which dead letters `dead-letters list` shows.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Reasons to show; empty: all.
    pub reasons: Vec<String>,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only those written this recently.
    pub since: Option<Duration>,
    /// At most this many, in key order.
    pub limit: i64,
}

/// The dead letters of `filter`, parked or re-driven, in key order.
pub async fn list(pool: &Pool, filter: &ListFilter) -> Result<Vec<Listed>, RedriveError> {
    let read = |e: InboxError| RedriveError::Read(e);
    let client = pool.get().await.map_err(|e| read(e.into()))?;
    let since = filter.since.map(|d| d.as_secs_f64());
    let rows = client
        .query(
            LIST,
            &[&filter.reasons, &filter.topic, &since, &filter.limit],
        )
        .await
        .map_err(|e| read(e.into()))?;
    rows.iter()
        .map(|r| Listed::from_row(r).map_err(|e| read(e.into())))
        .collect()
}

/// What [`redrive`] would select now, changing nothing (`--dry-run`).
pub async fn preview(pool: &Pool, selection: &Selection) -> Result<Vec<Listed>, RedriveError> {
    let read = |e: InboxError| RedriveError::Read(e);
    let client = pool.get().await.map_err(|e| read(e.into()))?;
    let mut all: Vec<Listed> = Vec::new();
    loop {
        let after = all.last().map(|l| l.position.clone());
        let params = batch::Params::new(selection, after.as_ref());
        let rows = client
            .query(PREVIEW_PARKED, &params.as_sql())
            .await
            .map_err(|e| read(e.into()))?;
        let page = rows.len();
        for r in &rows {
            all.push(Listed::from_row(r).map_err(|e| read(e.into()))?);
        }
        if page < selection.batch_size.get() {
            return Ok(all);
        }
    }
}

/// Re-drives the dead letters of `selection` through `handler` (see the module documentation)
/// and says what it did.
pub async fn redrive<H: Handler>(
    pool: &Pool,
    handler: &H,
    selection: &Selection,
) -> Result<RedriveReport, RedriveError> {
    let mut report = RedriveReport::default();
    let mut after: Option<Position> = None;
    loop {
        let lock = Lock::Next {
            selection,
            after: after.as_ref(),
        };
        match attempt(pool, handler, &selection.decoding, lock).await {
            Ok(done) if done.positions.is_empty() => return Ok(report),
            Ok(done) => {
                report.add(&done.report);
                after = done.positions.last().cloned();
            }
            Err(f) if f.error.fault() == Fault::Message => {
                let last = f.positions.last().cloned();
                one_by_one(
                    pool,
                    handler,
                    &selection.decoding,
                    &f.positions,
                    &mut report,
                )
                .await?;
                after = last;
            }
            Err(f) => return Err(stopped(f, after.as_ref())),
        }
    }
}

/// After a batch failed with a message's fault: each of its dead letters in a transaction of its
/// own; one that fails alone stays parked with the error and one more attempt.
async fn one_by_one<H: Handler>(
    pool: &Pool,
    handler: &H,
    decoding: &Decoding,
    positions: &[Position],
    report: &mut RedriveReport,
) -> Result<(), RedriveError> {
    for position in positions {
        match attempt(pool, handler, decoding, Lock::One(position)).await {
            Ok(done) => report.add(&done.report),
            Err(f) if f.error.fault() == Fault::Message => {
                let detail = chain(&f.error);
                tracing::warn!(%position, "dead letter failed again: {detail}");
                batch::mark_failed(pool, position, &detail)
                    .await
                    .map_err(|error| stopped(Failed::at(error, position), None))?;
                report.failed_again += 1;
            }
            Err(f) => return Err(stopped(f, Some(position))),
        }
    }
    Ok(())
}

/// Attempts of a batch that fails transiently before the redrive stops.
const ATTEMPTS: u32 = 5;

/// One batch, retried with backoff while it fails transiently.
async fn attempt<H: Handler>(
    pool: &Pool,
    handler: &H,
    decoding: &Decoding,
    lock: Lock<'_>,
) -> Result<batch::Done, Failed> {
    let mut backoff = Duration::from_millis(100);
    let mut tries = 1;
    loop {
        let result = match pool.get().await {
            Ok(mut client) => batch::run(&mut client, handler, decoding, lock).await,
            Err(e) => Err(Failed::new(e.into(), Vec::new())),
        };
        match result {
            Err(f) if f.error.fault() == Fault::Transient && tries < ATTEMPTS => {
                tracing::warn!(
                    "redrive batch failed transiently, retrying: {}",
                    chain(&f.error)
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                tries += 1;
            }
            result => return result,
        }
    }
}

fn stopped(f: Failed, before: Option<&Position>) -> RedriveError {
    let from = f
        .positions
        .first()
        .or(before)
        .map_or_else(|| "the start".to_owned(), Position::to_string);
    RedriveError::Batch {
        from,
        source: f.error,
    }
}

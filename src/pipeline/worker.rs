//! One partition's worker: batches its records, runs the inbox transaction, then stores offsets.
//!
//! Invariant (the one this module exists to keep): an offset is stored only after the database
//! transaction covering every record before it has committed. A batch that fails transiently is
//! retried with backoff; a batch that fails for the message's fault ([`Fault::Message`](crate::Fault::Message)) is
//! bisected to dead-letter the poison messages (module `poison`); a batch that fails for the
//! environment's fault ([`Fault::Environment`](crate::Fault::Environment): a missing table, a revoked grant) stalls the
//! partition: it is retried with capped backoff until it commits, and nothing is dead-lettered,
//! committed or stored meanwhile.
//!
//! The worker knows no broker: it reads [`Input`]s from any stream and acknowledges through an
//! [`OffsetSink`] (the source seam, module `source`), so tests drive it with channels and paused
//! time.

use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::{FutureExt, Stream, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{InboxError, RunError};
use crate::failpoint::failpoint;
use crate::observe::metrics::Arrival;
use crate::observe::outcome::BatchSample;
use crate::observe::stats::Stats;
use crate::pipeline::batcher::{Batch, Batcher, BatcherSettings, Batching};
use crate::pipeline::handler::Handler;
use crate::pipeline::inbox::{Inbox, Mode, TxOutcome};
use crate::pipeline::message::{Decoded, RawMessage};
use crate::pipeline::offsets::OffsetTracker;
pub use crate::source::{Input, OffsetSink};

mod breaker;
mod poison;
mod positions;
mod retry;
mod sequence;

use breaker::Breaker;
pub use breaker::{
    parse_max_poison_rate, parse_poison_limit, MaxPoisonLimit, PoisonLimit, PoisonRate, PoisonShare,
};
pub use retry::RetryPolicy;
pub(crate) use retry::TIMEOUTS_BEFORE_SPLIT;
use sequence::{Continuity, Sequence};

impl Default for WorkerSettings {
    /// The product's: batched, [`BatcherSettings::default`], natural batching, the default
    /// retries and poison-rate breaker, no unsafe switch.
    fn default() -> Self {
        Self {
            mode: Mode::Batched,
            batcher: BatcherSettings::default(),
            batching: crate::pipeline::defaults::BATCHING,
            retry: RetryPolicy::default(),
            max_poison_rate: Some(PoisonRate::DEFAULT),
            poison_share: PoisonShare::DEFAULT,
            consume_only: false,
            unsafe_controls: crate::unsafe_controls::UnsafeControls::default(),
        }
    }
}

impl WorkerSettings {
    /// THE LOAD TOOLS' BROKER CEILING (feature `consume-only`, off in the product): consume,
    /// batch and store offsets, and apply nothing, not even the inbox. It measures the broker
    /// and the client alone.
    #[cfg(feature = "consume-only")]
    pub fn only_consume(mut self) -> Self {
        self.consume_only = true;
        self
    }
}

/// Settings shared by every partition worker of a processor.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct WorkerSettings {
    /// Batched or per-message transactions.
    pub mode: Mode,
    /// Batch limits.
    pub batcher: BatcherSettings,
    /// When a batch closes besides its limits: after the linger, or as soon as the source has no
    /// more record ready.
    pub batching: Batching,
    /// Retry schedule.
    pub retry: RetryPolicy,
    /// The poison-rate breaker's floor (`None`: off); module `breaker`.
    pub max_poison_rate: Option<PoisonRate>,
    /// The poison-rate breaker's share of the last messages (when it is on).
    pub poison_share: PoisonShare,
    /// The load tools' broker ceiling ([`WorkerSettings::only_consume`]); `false` in the product.
    pub(crate) consume_only: bool,
    /// TEST-ONLY, UNSAFE switches; off (the only value of a normal build).
    pub unsafe_controls: crate::unsafe_controls::UnsafeControls,
}

/// The state of one assigned partition.
pub struct PartitionWorker<H: Handler, S: OffsetSink + ?Sized> {
    topic: Arc<str>,
    partition: i32,
    inbox: Arc<Inbox<H>>,
    sink: Arc<S>,
    settings: WorkerSettings,
    stats: Arc<Stats>,
    at_eof: Arc<AtomicBool>,
    tracker: OffsetTracker,
    batcher: Batcher<Arrived>,
    sequence: Sequence,
    /// Set when a record's offset went back: the failure the worker stops with.
    went_back: Option<RunError>,
    breaker: Breaker,
    /// An input read while pulling the ready records (natural batching), handled next.
    pending: Option<Option<Input>>,
    /// Set when the partition was moved to the database's position since it was last read.
    rewound: bool,
    /// When the position was last compared with the database's (an idle partition).
    checked: positions::Checked,
}

enum Step {
    Input(Option<Input>),
    Linger,
    Stop,
    /// Time to look whether the database's position should be compared with this member's
    /// (an idle partition).
    Check,
}

impl<H: Handler, S: OffsetSink + ?Sized> PartitionWorker<H, S> {
    /// A worker for `topic`/`partition`. `at_eof` is set while every record read so far is
    /// committed and the source reported its end.
    pub fn new(
        topic: Arc<str>,
        partition: i32,
        inbox: Arc<Inbox<H>>,
        sink: Arc<S>,
        settings: WorkerSettings,
        stats: Arc<Stats>,
        at_eof: Arc<AtomicBool>,
    ) -> Self {
        let batcher = Batcher::new(settings.batcher);
        Self {
            topic,
            partition,
            inbox,
            sink,
            settings,
            stats,
            at_eof,
            tracker: OffsetTracker::default(),
            batcher,
            sequence: Sequence::default(),
            went_back: None,
            breaker: Breaker::new(settings.max_poison_rate, settings.poison_share),
            pending: None,
            rewound: false,
            checked: positions::Checked::now(),
        }
    }

    /// Runs until the source ends or `stop` is cancelled. On stop, records already read are
    /// committed before returning (unless the database is failing, in which case they are left
    /// for redelivery).
    pub async fn run(
        mut self,
        source: impl Stream<Item = Input>,
        stop: CancellationToken,
    ) -> Result<(), RunError> {
        let mut source = pin!(source);
        let mut check = positions::check_interval();
        let checks = self.inbox.offsets_group().is_some();
        loop {
            let deadline = self.batcher.deadline();
            let step = match self.pending.take() {
                Some(input) => Step::Input(input),
                None => tokio::select! {
                    biased;
                    _ = stop.cancelled() => Step::Stop,
                    _ = sleep_until_opt(deadline) => Step::Linger,
                    input = source.next() => Step::Input(input),
                    _ = check.tick(), if checks => Step::Check,
                },
            };
            match step {
                Step::Stop | Step::Input(None) => {
                    self.batcher.flush();
                    return self.drain_or_rewind(&stop, true).await.map(|_| ());
                }
                Step::Linger => self.batcher.tick(Instant::now()),
                Step::Check => {
                    self.check_position(&stop).await?;
                    continue;
                }
                Step::Input(Some(Input::Record(raw))) => {
                    self.accept(raw);
                    if self.settings.batching == Batching::Natural {
                        self.pull_ready(source.as_mut());
                        self.batcher.tick(Instant::now());
                    }
                    if let Some(error) = self.went_back.take() {
                        return Err(error);
                    }
                }
                Step::Input(Some(Input::Eof)) => {
                    self.batcher.flush();
                    if !self.drain_or_rewind(&stop, false).await? {
                        return Ok(());
                    }
                    if std::mem::take(&mut self.rewound) {
                        // The records re-read from the database's position come first.
                        continue;
                    }
                    if !self.past_markers(&stop).await? {
                        return Ok(());
                    }
                    self.at_eof.store(true, Ordering::Release);
                    continue;
                }
                Step::Input(Some(Input::Error(e))) => {
                    tracing::warn!(topic = %self.topic, partition = self.partition, "consumer: {e}");
                }
            }
            if !self.drain_or_rewind(&stop, false).await? {
                return Ok(());
            }
        }
    }

    /// Adds a record to the open batch, unless its offset went back ([`Continuity::Back`]):
    /// then nothing more is accepted and the worker fails ([`RunError::OffsetsWentBack`]),
    /// before anything of the other log is applied.
    fn accept(&mut self, raw: RawMessage) {
        if self.went_back.is_some() {
            return;
        }
        self.at_eof.store(false, Ordering::Release);
        let (topic, stats) = (&self.topic, &self.stats);
        let seen = self
            .sequence
            .observe(topic, self.partition, raw.offset, stats);
        if let Continuity::Back { expected } = seen {
            self.went_back = Some(RunError::OffsetsWentBack {
                topic: topic.to_string(),
                partition: self.partition,
                expected,
                received: raw.offset,
            });
            return;
        }
        let size = raw.size_bytes();
        let at_ms = unix_ms(std::time::SystemTime::now());
        self.batcher
            .push(Arrived { raw, at_ms }, size, Instant::now());
    }

    /// Records when the records of a batch that just closed arrived, and returns its records.
    fn closed(&self, batch: Batch<Arrived>) -> Batch<RawMessage> {
        let arrivals: Vec<Arrival> = batch
            .items
            .iter()
            .map(|a| Arrival {
                timestamp_ms: a.raw.timestamp_ms,
                at_ms: a.at_ms,
            })
            .collect();
        let closed_ms = unix_ms(std::time::SystemTime::now());
        self.stats.record_arrivals(&arrivals, closed_ms);
        Batch {
            items: batch.items.into_iter().map(|a| a.raw).collect(),
            opened: batch.opened,
        }
    }

    /// Natural batching: adds every record the source has ready now, without waiting, until a
    /// batch closes on its limits; anything else the source yields is kept for the next step.
    fn pull_ready(&mut self, mut source: Pin<&mut impl Stream<Item = Input>>) {
        while !self.batcher.has_ready() && self.went_back.is_none() {
            match source.next().now_or_never() {
                Some(Some(Input::Record(raw))) => self.accept(raw),
                Some(other) => {
                    self.pending = Some(other);
                    return;
                }
                None => return,
            }
        }
    }

    /// Commits every closed batch in order. Returns false when one was abandoned (the worker
    /// is stopping while the database fails): the batches after it are dropped uncommitted, so
    /// no offset can move past it, and the worker must stop.
    async fn drain_ready(
        &mut self,
        stop: &CancellationToken,
        stopping: bool,
    ) -> Result<bool, RunError> {
        while let Some(batch) = self.batcher.pop_ready() {
            if !self.commit(batch, stop, stopping).await? {
                self.batcher.clear();
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Applies a batch and stores its offsets. Returns false when the batch was abandoned
    /// because the worker is stopping while the database fails.
    async fn commit(
        &mut self,
        batch: Batch<Arrived>,
        stop: &CancellationToken,
        stopping: bool,
    ) -> Result<bool, RunError> {
        let batch = self.closed(batch);
        let _in_flight = self.stats.telemetry.batch_in_flight();
        let clock = BatchClock {
            opened: batch.opened.into_std(),
            closed: Instant::now().into_std(),
        };
        let last = batch.items.last().map(|m| m.offset);
        if self.settings.unsafe_controls.offsets_before_commit()
            && self.settings.mode != Mode::PerMessage
        {
            self.store_offset(last);
        }
        if self.settings.consume_only {
            let timestamps: Vec<Option<i64>> = batch.items.iter().map(|m| m.timestamp_ms).collect();
            let outcome = TxOutcome {
                received: batch.items.len() as u64,
                ..TxOutcome::default()
            };
            self.committed(&outcome, last, clock, &timestamps);
            return Ok(true);
        }
        match self.settings.mode {
            Mode::Batched => {
                let decoded = self.inbox.decode(batch.items);
                self.apply_isolating(decoded, clock, stop, stopping).await
            }
            Mode::PerMessage => {
                for raw in batch.items {
                    if self.settings.unsafe_controls.offsets_before_commit() {
                        self.store_offset(Some(raw.offset));
                    }
                    let decoded = self.inbox.decode(vec![raw]);
                    if !self.apply_isolating(decoded, clock, stop, stopping).await? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        }
    }

    /// The error that stops the worker: `source` failed the records from `first_offset` on.
    fn batch_error(&self, first_offset: i64, source: InboxError) -> RunError {
        RunError::Batch {
            topic: self.topic.to_string(),
            partition: self.partition,
            offset: first_offset,
            source,
        }
    }

    fn committed(
        &mut self,
        outcome: &TxOutcome,
        last_offset: Option<i64>,
        clock: BatchClock,
        timestamps_ms: &[Option<i64>],
    ) {
        let committed_at = std::time::SystemTime::now();
        failpoint!("after_commit_before_offset");
        let store_started = std::time::Instant::now();
        self.store_offset(last_offset);
        failpoint!("after_offset_store");
        let sample = BatchSample {
            opened: clock.opened,
            closed: clock.closed,
            timings: outcome.timings,
            offset_store: store_started.elapsed(),
            timestamps_ms,
        };
        self.stats.record_batch(outcome, &sample, committed_at);
    }

    /// Stores the position after `last_offset` when it moves forward.
    fn store_offset(&mut self, last_offset: Option<i64>) {
        if let Some(next) = last_offset.and_then(|o| self.tracker.committed_through(o)) {
            if let Err(e) = self.sink.store(&self.topic, self.partition, next) {
                self.stats.offsets_refused.fetch_add(1, Ordering::Relaxed);
                // The partition was revoked meanwhile: its new owner replays from the last
                // commit and the inbox skips what this batch applied.
                tracing::warn!(topic = %self.topic, partition = self.partition, next, "offset not stored: {e}");
            }
        }
    }
}

/// A record and when it arrived (Unix ms), while its batch is open.
struct Arrived {
    raw: RawMessage,
    at_ms: i64,
}

fn unix_ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// When a batch opened and closed (for latency measurements).
#[derive(Debug, Clone, Copy)]
struct BatchClock {
    opened: std::time::Instant,
    closed: std::time::Instant,
}

/// How an attempt at one transaction ended.
enum Attempt {
    /// It committed.
    Committed(TxOutcome),
    /// The worker is stopping while the database fails: left for redelivery.
    Abandoned,
    /// It failed for a reason retrying cannot fix.
    Failed(InboxError),
    /// A part of several messages timed out [`TIMEOUTS_BEFORE_SPLIT`] times: bisect it.
    TimedOut(InboxError),
}

fn first_offset<P>(d: &Decoded<P>) -> i64 {
    let a = d.messages.first().map(|m| m.raw.offset);
    let b = d.dead_letters.first().map(|l| l.raw.offset);
    a.into_iter().chain(b).min().unwrap_or(-1)
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

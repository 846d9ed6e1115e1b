//! A run's acknowledgements: the [`OffsetSink`] of one connection's reading of the consumer.
//!
//! Each delivery's acknowledgement subject waits here under its stream sequence until a batch up
//! to it commits. Then, with `AckPolicy::All`, one `+ACK` to the batch's last delivery covers
//! every lower sequence (duplicates and dead letters included, all committed by then); with
//! `AckPolicy::Explicit`, each delivery gets its own. `store` only queues them on the connection
//! (its write task sends them in order, in one flush), so it never waits on the network.
//!
//! While deliveries wait, a task sends each one an in-progress acknowledgement (`+WPI`) every
//! third of `ack_wait`, so that a batch held by a stall on the database, a retry or a slow
//! transaction is not delivered again meanwhile (to this instance or to a standby that takes
//! over). That is one small publish per held delivery per period: 2,000 every 10 s with batches
//! of 1,000 and the default `ack_wait` of 30 s. A process paused past `ack_wait` (SIGSTOP, a VM
//! frozen) sends none: its deliveries come again; a copy applied meanwhile by another holder
//! waits on the inbox's key and is skipped.
//!
//! A rewind (the database holds another position than this run) ends the run: the feed forwards
//! nothing more, what the run holds is given back at once (`-NAK`), and the next run starts from
//! the database's position. JetStream keeps what was acknowledged (with limits retention), so a
//! rewind below an acknowledgement is read again from the stream by a consumer created at the
//! database's position (module `nats`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::proto::Conn;
use crate::observe::stats::Stats;
use crate::source::OffsetSink;

/// The acknowledgements of one run.
pub(super) struct RunAcks {
    conn: Conn,
    /// The deliveries handed to the run and not acknowledged: sequence → acknowledgement
    /// subject.
    held: Mutex<BTreeMap<i64, Bytes>>,
    /// `AckPolicy::All`: one ack per batch.
    all: bool,
    /// Set by a rewind or the run's end: nothing more is forwarded to the run.
    pub(super) ended: CancellationToken,
    /// Told when deliveries are acknowledged (the feed waits on it while two batches are held).
    released: tokio::sync::Notify,
    /// A sequence the database's position must go back to before the next run, and the
    /// position the run had reached.
    rewind_to: Mutex<Option<(i64, i64)>>,
    stats: Arc<Stats>,
}

impl RunAcks {
    /// The acks of a run on `conn`, and the task that keeps what it holds in progress.
    pub(super) fn new(
        conn: Conn,
        all: bool,
        ack_wait: Duration,
        lease: Arc<super::Lease>,
        stats: Arc<Stats>,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let acks = Arc::new(Self {
            conn,
            held: Mutex::new(BTreeMap::new()),
            all,
            ended: CancellationToken::new(),
            released: tokio::sync::Notify::new(),
            rewind_to: Mutex::new(None),
            stats,
        });
        let every = (ack_wait / 3).max(Duration::from_millis(200));
        let task = tokio::spawn(keep_in_progress(Arc::downgrade(&acks), every, lease));
        (acks, task)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, Bytes>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps the acknowledgement subject of the delivery at `seq` until a batch up to it
    /// commits.
    pub(super) fn hold(&self, seq: i64, reply: Bytes) {
        self.lock().insert(seq, reply);
    }

    /// Deliveries held.
    pub(super) fn held(&self) -> usize {
        self.lock().len()
    }

    /// Whether the run holds the delivery at `seq`.
    pub(super) fn holds(&self, seq: i64) -> bool {
        self.lock().contains_key(&seq)
    }

    /// Resolves when deliveries were acknowledged, or after 100 ms.
    pub(super) async fn released(&self) {
        let _ = tokio::time::timeout(Duration::from_millis(100), self.released.notified()).await;
    }

    /// Ends the run, which had reached `reached`; the database's position goes back to `seq`
    /// before the next one.
    pub(super) fn rewind_to_seq(&self, seq: i64, reached: i64) {
        let mut target = self
            .rewind_to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *target = Some(target.map_or((seq, reached), |(t, r)| (t.min(seq), r.max(reached))));
        self.ended.cancel();
    }

    /// The sequence the database's position must go back to, when a delivery asked for it, and
    /// the position the run had reached.
    pub(super) fn rewind_to(&self) -> Option<(i64, i64)> {
        *self
            .rewind_to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A delivery at `seq`, below what the run reached, came again (its ack was late or lost):
    /// when the run holds it, its batch acknowledges it; otherwise it is committed (below the
    /// database's position, or acknowledged by this run already) and acknowledged again.
    pub(super) fn delivered_again(&self, seq: i64, reply: Bytes) {
        if self.lock().contains_key(&seq) {
            return;
        }
        self.send(&reply, b"+ACK");
    }

    fn send(&self, reply: &[u8], what: &[u8]) -> bool {
        self.conn.publish(reply, None, what)
    }

    /// Gives back what the run holds (not committed): delivered again at once, not after
    /// `ack_wait`.
    pub(super) fn nak_held(&self) {
        let held = std::mem::take(&mut *self.lock());
        for reply in held.values() {
            self.send(reply, b"-NAK");
        }
    }
}

/// Sends `+WPI` for every held delivery every `every`, while the lock's lease is fresh, until
/// the run's acks are gone.
async fn keep_in_progress(
    acks: std::sync::Weak<RunAcks>,
    every: Duration,
    lease: Arc<super::Lease>,
) {
    loop {
        tokio::time::sleep(every).await;
        let Some(acks) = acks.upgrade() else { return };
        if acks.ended.is_cancelled() || acks.conn.is_closed() {
            return;
        }
        if !lease.fresh() {
            continue;
        }
        let replies: Vec<Bytes> = acks.lock().values().cloned().collect();
        for reply in &replies {
            acks.send(reply, b"+WPI");
        }
    }
}

impl OffsetSink for RunAcks {
    fn store(&self, _topic: &str, _partition: i32, next_offset: i64) -> Result<(), String> {
        let done = {
            let mut held = self.lock();
            let rest = held.split_off(&next_offset);
            std::mem::replace(&mut *held, rest)
        };
        let sent = match self.all {
            true => match done.values().next_back() {
                Some(last) => self.send(last, b"+ACK"),
                None => true,
            },
            false => done.values().all(|reply| self.send(reply, b"+ACK")),
        };
        self.released.notify_waiters();
        if !sent {
            self.stats.offsets_refused.fetch_add(1, Ordering::Relaxed);
            return Err(
                "the connection is closed: what the ack covered is delivered again after \
                 ack_wait and skipped (the database's position is past it)"
                    .to_owned(),
            );
        }
        Ok(())
    }

    fn rewind(
        &self,
        _topic: &str,
        _partition: i32,
        _next_offset: Option<i64>,
    ) -> Result<(), String> {
        // The run ends; the next one starts from the database's position, and a consumer
        // that acknowledged past it is created again there.
        self.ended.cancel();
        Ok(())
    }
}

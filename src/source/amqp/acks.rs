//! A queue channel's acknowledgements: the [`OffsetSink`] of one channel's run.
//!
//! Each delivery's acker waits here under its position until a batch up to it commits; then the
//! last one of the batch is sent with `multiple = true`, which covers every earlier delivery of
//! the channel (duplicates and dead letters included, all committed by then). `store` does not
//! wait on the network: it hands the acker to the channel's ack task, which sends them in order.
//! An acker of a closed channel is refused by the client (it is poisoned when its channel
//! closes), so nothing is ever acknowledged on another channel than the one that delivered it;
//! what such an ack covered is delivered again and skipped by the inbox.
//!
//! A rewind (the database holds another position than this run: a commit whose answer was lost,
//! another instance's progress, a database that went back in time) ends the channel: the feeder
//! forwards nothing more, the channel closes (its unacknowledged deliveries go back to the queue)
//! and the next channel is numbered from the database's position. A database that went back
//! below a position already acknowledged to RabbitMQ lost records the queue no longer holds: the
//! rewind is refused and the processor stops, saying so.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lapin::options::BasicAckOptions;
use lapin::Acker;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::observe::stats::Stats;
use crate::source::OffsetSink;

/// What one queue acknowledged, across its channels in this process.
#[derive(Debug)]
pub(super) struct Acknowledged {
    /// The position after the last delivery acknowledged (`i64::MIN`: none yet).
    through: AtomicI64,
    /// Acks handed to the ack tasks and not yet sent.
    in_flight: AtomicU64,
    /// The ack being sent (`i64::MIN`: none) and the highest one that may still be.
    gate: Gate,
}

impl Default for Acknowledged {
    fn default() -> Self {
        Self {
            through: AtomicI64::new(i64::MIN),
            in_flight: AtomicU64::new(0),
            gate: Gate::default(),
        }
    }
}

impl Acknowledged {
    /// The position after the last delivery acknowledged, if any.
    pub(super) fn through(&self) -> Option<i64> {
        Some(self.through.load(Ordering::Acquire)).filter(|&p| p != i64::MIN)
    }

    /// Whether every ack handed over was sent (or refused).
    pub(super) fn settled(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }
}

/// Keeps a rewind and the ack task from crossing: an ack queued before a rewind, beyond the
/// position the database now holds, must not be sent after the rewind was accepted (its records
/// are not in the database any more: acknowledged, they would be gone).
///
/// The ack task announces the ack it is about to send, then checks the ceiling; a rewind lowers
/// the ceiling, then looks at the ack being sent. Both sides use sequentially consistent
/// operations, so at least one of them sees the other: either the ack is skipped (its deliveries
/// come back with the channel and are applied again), or the rewind sees it and is refused.
#[derive(Debug)]
pub(super) struct Gate {
    sending: AtomicI64,
    ceiling: AtomicI64,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            sending: AtomicI64::new(i64::MIN),
            ceiling: AtomicI64::new(i64::MAX),
        }
    }
}

impl Gate {
    /// A new channel: every ack may go.
    fn open(&self) {
        self.ceiling.store(i64::MAX, Ordering::SeqCst);
    }

    /// Whether the ack up to `next` may be sent; when it may, [`Gate::sent`] must follow.
    fn begin(&self, next: i64) -> bool {
        self.sending.store(next, Ordering::SeqCst);
        if next > self.ceiling.load(Ordering::SeqCst) {
            self.sending.store(i64::MIN, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The ack begun is sent or refused.
    fn sent(&self) {
        self.sending.store(i64::MIN, Ordering::SeqCst);
    }

    /// No ack beyond `target` is sent from now on; `Err` with the ack being sent when one beyond
    /// it may already be on its way.
    fn lower(&self, target: i64) -> Result<(), i64> {
        self.ceiling.store(target, Ordering::SeqCst);
        match self.sending.load(Ordering::SeqCst) {
            sending if sending > target => Err(sending),
            _ => Ok(()),
        }
    }
}

/// The acknowledgements of one channel's run.
pub(super) struct ChannelAcks {
    /// The deliveries read and not yet acknowledged: (position, acker), in order.
    waiting: Mutex<VecDeque<(i64, Acker)>>,
    /// To the channel's ack task.
    send: mpsc::UnboundedSender<(i64, Acker)>,
    /// Set by a rewind: the channel ends; nothing more is forwarded to the run.
    pub(super) ended: CancellationToken,
    /// The queue's acknowledgements.
    acked: Arc<Acknowledged>,
}

impl ChannelAcks {
    /// The acks of a new channel, and the task that sends them.
    pub(super) fn new(
        queue: Arc<str>,
        acked: Arc<Acknowledged>,
        stats: Arc<Stats>,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let (send, receive) = mpsc::unbounded_channel();
        acked.gate.open();
        let acks = Arc::new(Self {
            waiting: Mutex::new(VecDeque::new()),
            send,
            ended: CancellationToken::new(),
            acked: acked.clone(),
        });
        let task = tokio::spawn(send_acks(queue, receive, acked, stats));
        (acks, task)
    }

    /// Keeps the acker of the delivery at `position` until a batch up to it commits.
    pub(super) fn hold(&self, position: i64, acker: Acker) {
        self.lock().push_back((position, acker));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(i64, Acker)>> {
        // A poisoned lock only means another thread panicked while holding it; the queue of
        // ackers is still consistent (push and pop are single operations).
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl OffsetSink for ChannelAcks {
    fn store(&self, _topic: &str, _partition: i32, next_offset: i64) -> Result<(), String> {
        let last = {
            let mut waiting = self.lock();
            let mut last = None;
            while waiting.front().is_some_and(|(p, _)| *p < next_offset) {
                last = waiting.pop_front();
            }
            last
        };
        let Some((position, acker)) = last else {
            return Ok(());
        };
        self.acked.in_flight.fetch_add(1, Ordering::AcqRel);
        self.send.send((position + 1, acker)).map_err(|_| {
            self.acked.in_flight.fetch_sub(1, Ordering::AcqRel);
            "the channel's ack task has ended".to_owned()
        })
    }

    fn rewind(&self, topic: &str, _partition: i32, next_offset: Option<i64>) -> Result<(), String> {
        let target = next_offset.unwrap_or(0);
        let refused = |acknowledged: i64| lost_below(topic, target, acknowledged);
        // First no ack beyond the target may leave (one queued for a batch the database lost
        // is dropped), then what was sent is checked.
        self.acked.gate.lower(target).map_err(refused)?;
        if let Some(through) = self.acked.through() {
            if target < through {
                return Err(refused(through));
            }
        }
        // The channel ends: its unacknowledged deliveries go back to the queue, and the next
        // channel is numbered from the database's position.
        self.ended.cancel();
        self.lock().clear();
        Ok(())
    }
}

/// What a database that went back below `acknowledged` (to `held`) lost on `queue`.
pub(super) fn lost_below(queue: &str, held: i64, acknowledged: i64) -> String {
    format!(
        "queue {queue}: the database holds position {held}, below {acknowledged} already \
         acknowledged to RabbitMQ: the records between were acknowledged and are gone from the \
         queue (the database went back in time: a restore, or a failover to a replica that \
         lagged). A queue cannot be read again; see docs/RABBITMQ.md, \"A database that goes \
         back in time\""
    )
}

/// How long an ack may take to be handed to the connection.
const ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Sends the acks of one channel, in order, until the channel's run ends.
async fn send_acks(
    queue: Arc<str>,
    mut receive: mpsc::UnboundedReceiver<(i64, Acker)>,
    acked: Arc<Acknowledged>,
    stats: Arc<Stats>,
) {
    while let Some((next, acker)) = receive.recv().await {
        if !acked.gate.begin(next) {
            // Beyond a rewind's position: never sent (module docs).
            stats.offsets_refused.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                queue = %queue, position = next,
                "not acknowledged: the database went back below it; its deliveries come back"
            );
            acked.in_flight.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        // An ack on a connection that died may never be answered by the client: given up after
        // ACK_TIMEOUT, like a refused one (the channel is gone; its deliveries come back).
        let sent =
            match tokio::time::timeout(ACK_TIMEOUT, acker.ack(BasicAckOptions { multiple: true }))
                .await
            {
                Ok(sent) => sent,
                Err(_) => {
                    // The client took the ack on the first poll: it may still leave when the
                    // socket drains. Counted as acknowledged, so that no rewind below it is
                    // accepted.
                    acked.through.fetch_max(next, Ordering::AcqRel);
                    Ok(false)
                }
            };
        match sent {
            Ok(true) => {
                acked.through.fetch_max(next, Ordering::AcqRel);
            }
            Ok(false) => {
                stats.offsets_refused.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    queue = %queue, position = next,
                    "the channel closed before its deliveries were acknowledged: they are \
                     delivered again, and the inbox skips them"
                );
            }
            Err(e) => {
                stats.offsets_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    queue = %queue, position = next,
                    "acknowledgement refused: {e}; the deliveries it covered are delivered again, \
                     and the inbox skips them"
                );
            }
        }
        acked.gate.sent();
        acked.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::Gate;

    #[test]
    fn an_ack_beyond_a_lowered_ceiling_is_not_begun() {
        let gate = Gate::default();
        assert!(gate.begin(10));
        gate.sent();
        assert_eq!(gate.lower(10), Ok(()));
        assert!(gate.begin(10), "at the ceiling: the database holds it");
        gate.sent();
        assert!(!gate.begin(11));
        gate.open();
        assert!(gate.begin(11), "a new channel");
    }

    #[test]
    fn a_rewind_during_a_send_beyond_it_is_refused() {
        let gate = Gate::default();
        assert!(gate.begin(20));
        assert_eq!(gate.lower(15), Err(20));
        gate.sent();
        assert_eq!(gate.lower(15), Ok(()));
    }
}

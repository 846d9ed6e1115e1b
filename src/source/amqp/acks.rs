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
}

impl Default for Acknowledged {
    fn default() -> Self {
        Self {
            through: AtomicI64::new(i64::MIN),
            in_flight: AtomicU64::new(0),
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
        if let Some(through) = self.acked.through() {
            if target < through {
                return Err(format!(
                    "queue {topic}: the database holds position {target}, below {through} \
                     already acknowledged to RabbitMQ: the records between were acknowledged \
                     and are gone from the queue (the database went back in time: a restore, \
                     or a failover to a replica that lagged). A queue cannot be read again; \
                     see docs/RABBITMQ.md, \"A database that goes back in time\""
                ));
            }
        }
        // The channel ends: its unacknowledged deliveries go back to the queue, and the next
        // channel is numbered from the database's position.
        self.ended.cancel();
        self.lock().clear();
        Ok(())
    }
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
        // An ack on a connection that died may never be answered by the client: given up after
        // ACK_TIMEOUT, like a refused one (the channel is gone; its deliveries come back).
        let sent = tokio::time::timeout(ACK_TIMEOUT, acker.ack(BasicAckOptions { multiple: true }))
            .await
            .unwrap_or(Ok(false));
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
        acked.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

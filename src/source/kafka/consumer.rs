//! The Kafka side: a consumer-group member with one queue and one worker per assigned partition.
//!
//! Invariant: `enable.auto.offset.store=false`; offsets are stored only by partition workers,
//! after their batch committed in PostgreSQL, and, when an assignment takes effect, as its start
//! offsets taken from the database (everything before them committed there); committed to Kafka by the client's auto-commit,
//! at revoke and at shutdown. Partition queues are split inside the rebalance callback, *before*
//! the assignment takes effect, so no record of an assigned partition ever reaches the main queue
//! and order within a partition is kept. On revoke, the partition's worker commits what it has
//! read and stops before the revoke returns. Before an assignment takes effect, an
//! [`AssignHook`] may set start offsets in it (the processor's one starts from the offsets stored
//! in the database, ahead of Kafka's or behind them: `resume`). Overrides that would break these invariants are
//! refused ([`refused`]).

mod input;
mod probe;
pub(crate) mod refused;
mod revoke;
mod settings;
mod startup_error;

pub(crate) use input::queue_input;
pub use settings::KafkaSettings;
pub use startup_error::KafkaStartupError;

use revoke::wait_for_workers;

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
    StreamConsumer,
};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message as _, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{KafkaClientError, RunError};
use crate::failpoint::failpoint;
use crate::observe::stats::Stats;
use crate::observe::telemetry::outage;
use crate::source::kafka::drain::DrainWatch;
use crate::source::OffsetSink;

pub(crate) mod headers;

/// The partition of the member-level series of the stalled gauge (`partition="member"`).
pub(crate) const MEMBER: i32 = -1;

/// The consumer type used by the processor.
pub(crate) type KafkaConsumer = StreamConsumer<GroupContext>;

/// Starts a worker for a newly assigned partition, with the start offset the [`AssignHook`]
/// set (the database's position; `None`: none set); returns its handle.
pub(crate) type Spawner = Box<
    dyn Fn(Arc<str>, i32, Option<i64>, StreamPartitionQueue<GroupContext>) -> WorkerHandle
        + Send
        + Sync,
>;

/// Called with each new assignment before it takes effect; may set partitions' start offsets.
pub(crate) type AssignHook =
    Box<dyn Fn(&BaseConsumer<GroupContext>, &mut TopicPartitionList) + Send + Sync>;

/// A running partition worker, as the group member sees it.
pub(crate) struct WorkerHandle {
    /// Cancelled to ask the worker to commit what it read and stop.
    pub stop: CancellationToken,
    /// Set while the worker is at the end of its partition with everything committed.
    pub at_eof: Arc<AtomicBool>,
    /// The worker task.
    pub join: JoinHandle<()>,
}

/// Receives librdkafka's statistics (every `statistics.interval.ms`).
pub(crate) type StatisticsSink = Box<dyn Fn(&rdkafka::Statistics) + Send + Sync>;

/// Consumer context: splits partition queues on assign, stops workers on revoke.
#[derive(Default)]
pub(crate) struct GroupContext {
    consumer: OnceLock<Weak<KafkaConsumer>>,
    spawner: OnceLock<Spawner>,
    on_assign: OnceLock<AssignHook>,
    statistics: OnceLock<StatisticsSink>,
    workers: Mutex<HashMap<(Arc<str>, i32), WorkerHandle>>,
    /// How long a revoke waits for a partition's in-flight batch.
    pub revoke_timeout: Duration,
    /// Counts the revoked partitions ([`Stats::partitions_revoked`]).
    stats: Arc<Stats>,
    /// The topics (joined with `,`) and group, for the member-level stall of refused offset
    /// commits.
    topic: String,
    group: String,
    /// Set while Kafka refuses the group's offset commits (its READ revoked).
    commits_refused: AtomicBool,
}

impl ClientContext for GroupContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        self.stats.kafka_outage.statistics(&statistics);
        if let Some(sink) = self.statistics.get() {
            sink(&statistics);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error {
            // End of partition is an event the partition workers handle, not a failure.
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF) => {}
            e if outage::is_connection_error(&e) => self.stats.kafka_outage.error(&e),
            e => tracing::warn!("kafka client: {e}: {reason}"),
        }
    }
}

impl ConsumerContext for GroupContext {
    /// rdkafka's rebalance, with one step added: before an assignment takes effect, the
    /// [`AssignHook`] may set start offsets in it (offsets stored in the database).
    fn rebalance(
        &self,
        base: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(base.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                if let Some(hook) = self.on_assign.get() {
                    hook(base, tpl);
                }
                self.pre_rebalance(base, &Rebalance::Assign(tpl));
                let assigned = match cooperative {
                    true => base.incremental_assign(tpl),
                    false => base.assign(tpl),
                };
                assigned.map(|()| store_start_offsets(base, tpl))
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.pre_rebalance(base, &Rebalance::Revoke(tpl));
                match cooperative {
                    true => base.incremental_unassign(tpl),
                    false => base.unassign(),
                }
            }
            e => {
                let error = KafkaError::Rebalance(e.into());
                self.pre_rebalance(base, &Rebalance::Error(error));
                base.unassign()
            }
        };
        if let Err(e) = result {
            tracing::error!("rebalance: cannot apply the assignment: {e}");
        }
    }

    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.assign(tpl),
            Rebalance::Revoke(tpl) => self.revoke(tpl, base.assignment_lost()),
            Rebalance::Error(e) => tracing::error!("rebalance error: {e}"),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => {
                tracing::debug!("offsets committed: {offsets:?}");
                self.stats.kafka_outage.answered();
                self.commits_accepted();
                failpoint!("after_offset_commit");
            }
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::GroupAuthorizationFailed)) => {
                self.commits_refused();
            }
            Err(e) => {
                tracing::warn!("offset commit failed (will be retried by the next commit): {e}")
            }
        }
    }
}

impl GroupContext {
    /// Kafka refuses the group's offset commits (the group's READ revoked): the member stalls
    /// visibly (a member-level series of the stalled gauge, `/readyz`, one WARN line). Records
    /// are still applied, each batch with its offsets in the database (`--offsets-in-db`).
    fn commits_refused(&self) {
        let what = "group authorization failed";
        self.stats
            .telemetry
            .stalls
            .kafka_refused(&self.topic, MEMBER, what);
        if !self.commits_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                group = %self.group,
                "group member stalled: Kafka refuses the group's offset commits ({what}): grant \
                 the processor's principal READ on the group; it resumes by itself once granted"
            );
        }
    }

    /// A commit was accepted: the member-level stall, if any, is over.
    fn commits_accepted(&self) {
        if self.commits_refused.swap(false, Ordering::Relaxed) {
            self.stats.telemetry.stalls.resumed(&self.topic, MEMBER);
            tracing::info!(group = %self.group, "Kafka accepts the group's offset commits again");
        }
    }

    fn lock_workers(&self) -> std::sync::MutexGuard<'_, HashMap<(Arc<str>, i32), WorkerHandle>> {
        // A worker map is never left half-updated by a panic: recover it.
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn assign(&self, tpl: &TopicPartitionList) {
        let (Some(consumer), Some(spawn)) = (
            self.consumer.get().and_then(Weak::upgrade),
            self.spawner.get(),
        ) else {
            return;
        };
        let mut workers = self.lock_workers();
        for elem in tpl.elements() {
            let key: (Arc<str>, i32) = (Arc::from(elem.topic()), elem.partition());
            if let Some(old) = workers.remove(&key) {
                tracing::warn!(topic = %key.0, partition = key.1, "assigned twice; replacing its worker");
                old.stop.cancel();
                old.join.abort();
            }
            match consumer.split_partition_queue(&key.0, key.1) {
                Some(queue) => {
                    tracing::info!(topic = %key.0, partition = key.1, "partition assigned");
                    let start = match elem.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    };
                    let handle = spawn(key.0.clone(), key.1, start, queue);
                    workers.insert(key, handle);
                }
                None => {
                    tracing::error!(topic = %key.0, partition = key.1, "cannot split partition queue")
                }
            }
        }
    }

    /// Stops the revoked partitions' workers. When the assignment was lost (the session timed
    /// out, e.g. the process was paused), the partitions already belong to another member:
    /// nothing is committed for them, or a stale offset could overwrite the new owner's.
    fn revoke(&self, tpl: &TopicPartitionList, lost: bool) {
        let revoked: Vec<WorkerHandle> = {
            let mut workers = self.lock_workers();
            tpl.elements()
                .iter()
                .filter_map(|e| workers.remove(&(Arc::from(e.topic()), e.partition())))
                .collect()
        };
        if revoked.is_empty() {
            return;
        }
        let count = &self.stats.partitions_revoked;
        count.fetch_add(revoked.len() as u64, Ordering::Relaxed);
        tracing::info!(
            "{} partition(s) revoked; finishing their batches",
            revoked.len()
        );
        for w in &revoked {
            w.stop.cancel();
        }
        wait_for_workers(revoked, self.revoke_timeout);
        if lost {
            tracing::warn!("assignment lost: nothing committed for the revoked partitions");
            return;
        }
        if let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) {
            commit_stored(&consumer, CommitMode::Async);
        }
    }

    /// Asks every worker to stop and waits for them.
    pub(crate) async fn stop_all(&self) {
        let all: Vec<WorkerHandle> = self.lock_workers().drain().map(|(_, w)| w).collect();
        for w in &all {
            w.stop.cancel();
        }
        for w in all {
            let _ = w.join.await;
        }
    }

    /// True when every partition this member holds is at its end with everything committed
    /// (also when it holds none). Whether the topic is done for the group is [`crate::source::kafka::drain`]'s.
    pub(crate) fn local_at_eof(&self) -> bool {
        let workers = self.lock_workers();
        workers.values().all(|w| w.at_eof.load(Ordering::Acquire))
    }
}

/// Stores, for Kafka's next commit, the explicit start offsets of a new assignment (only the
/// [`AssignHook`] sets them: offsets from the database, before which everything is committed
/// there). Otherwise a partition at its end would keep Kafka's older committed offset, and a lag
/// above 0, until a new record arrived.
fn store_start_offsets(base: &BaseConsumer<GroupContext>, tpl: &TopicPartitionList) {
    let mut start = TopicPartitionList::new();
    for e in tpl.elements() {
        if let Offset::Offset(o) = e.offset() {
            if let Err(e) = start.add_partition_offset(e.topic(), e.partition(), Offset::Offset(o))
            {
                tracing::warn!("cannot store a start offset: {e}");
            }
        }
    }
    if start.count() > 0 {
        if let Err(e) = base.store_offsets(&start) {
            tracing::warn!("cannot store the start offsets for Kafka's commit: {e}");
        }
        // librdkafka commits a stored offset only when it is past the committed one: an explicit
        // commit makes Kafka's committed offset follow the database's back too (a restore).
        if let Err(e) = base.commit(&start, CommitMode::Async) {
            tracing::warn!("cannot commit the start offsets to Kafka: {e}");
        }
    }
}

fn commit_stored(consumer: &KafkaConsumer, mode: CommitMode) {
    match consumer.commit_consumer_state(mode) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => tracing::warn!("offset commit failed: {e}"),
    }
}

/// Stores offsets in the consumer's offset store, for the next commit.
pub(crate) struct KafkaOffsets(Weak<KafkaConsumer>);

impl OffsetSink for KafkaOffsets {
    fn store(&self, topic: &str, partition: i32, next_offset: i64) -> Result<(), String> {
        let consumer = self.0.upgrade().ok_or("consumer closed")?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(next_offset))
            .map_err(|e| e.to_string())?;
        consumer.store_offsets(&tpl).map_err(|e| e.to_string())
    }

    /// Seeks the partition, then commits its new position explicitly: librdkafka commits a
    /// stored offset only when it is past the committed one, and Kafka's committed offset must
    /// follow the database's, in either direction.
    fn rewind(&self, topic: &str, partition: i32, next_offset: Option<i64>) -> Result<(), String> {
        let consumer = self.0.upgrade().ok_or("consumer closed")?;
        let offset = next_offset.map_or(Offset::Beginning, Offset::Offset);
        let seek = || {
            consumer
                .seek(topic, partition, offset, SEEK_TIMEOUT)
                .map_err(|e| format!("cannot seek to {offset:?}: {e}"))
        };
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        match multi_thread {
            true => tokio::task::block_in_place(seek)?,
            false => seek()?,
        }
        if let Some(next) = next_offset {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, Offset::Offset(next))
                .map_err(|e| e.to_string())?;
            if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                tracing::warn!(
                    topic,
                    partition,
                    "cannot commit the database's position to Kafka: {e}"
                );
            }
        }
        Ok(())
    }

    fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        let consumer = self.0.upgrade()?;
        let positions = consumer.position().ok()?;
        match positions.find_partition(topic, partition)?.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        }
    }
}

/// Longest wait for a seek to take effect.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// A subscribed group member. Drop it to leave the group.
pub(crate) struct GroupMember {
    consumer: Arc<KafkaConsumer>,
    topics: Arc<[Arc<str>]>,
}

impl GroupMember {
    /// Creates the consumer; `spawn` starts a worker for each assigned partition; revokes are
    /// counted in `stats`.
    pub(crate) fn new(
        settings: &KafkaSettings,
        revoke_timeout: Duration,
        stats: Arc<Stats>,
        spawn: impl FnOnce(Weak<KafkaConsumer>) -> Spawner,
        on_assign: Option<AssignHook>,
    ) -> Result<Self, RunError> {
        let context = GroupContext {
            revoke_timeout,
            stats,
            topic: settings.topics.join(","),
            group: settings.group.clone(),
            ..GroupContext::default()
        };
        let consumer: Arc<KafkaConsumer> = Arc::new(
            settings
                .client_config()
                .create_with_context(context)
                .map_err(|e| KafkaClientError::new(e, &settings.overrides))?,
        );
        let weak = Arc::downgrade(&consumer);
        let _ = consumer.context().consumer.set(weak.clone());
        let _ = consumer.context().spawner.set(spawn(weak));
        if let Some(hook) = on_assign {
            let _ = consumer.context().on_assign.set(hook);
        }
        let names: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&names)?;
        Ok(Self {
            consumer,
            topics: settings
                .topics
                .iter()
                .map(|t| Arc::from(t.as_str()))
                .collect(),
        })
    }

    /// Sends librdkafka's statistics to `sink` from now on (set once).
    pub(crate) fn on_statistics(&self, sink: StatisticsSink) {
        let _ = self.consumer.context().statistics.set(sink);
    }

    /// The member's librdkafka client handle, for requests rdkafka has no binding for; valid
    /// while the member lives.
    pub(crate) fn native_client(&self) -> *mut rdkafka_sys::bindings::rd_kafka_t {
        self.consumer.client().native_ptr()
    }

    /// An offset sink for workers of this member.
    pub(crate) fn offsets(consumer: Weak<KafkaConsumer>) -> KafkaOffsets {
        KafkaOffsets(consumer)
    }

    /// Polls the group (rebalances, errors) until `done` resolves, a worker fails, or, with a
    /// `drain` watch (`--exit-on-eof`, checked every 50 ms while this member's partitions are at
    /// their end), the whole topic is committed by the group.
    pub(crate) async fn poll_until(
        &self,
        done: impl Future<Output = ()>,
        failures: &mut mpsc::UnboundedReceiver<RunError>,
        mut drain: Option<DrainWatch>,
    ) -> Result<(), RunError> {
        let mut done = pin!(done);
        let mut check = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                biased;
                _ = &mut done => return Ok(()),
                Some(e) = failures.recv() => return Err(e),
                drained = DrainWatch::outcome_of(&mut drain) => if drained {
                    return Ok(());
                },
                _ = check.tick() => {
                    if let Some(drain) = drain.as_mut() {
                        if self.consumer.context().local_at_eof() {
                            drain.start(&self.consumer, &self.topics);
                        }
                    }
                }
                r = self.consumer.recv() => match r {
                    // Never expected: queues are split before assignment. Processing it here could
                    // break partition order, skipping it could lose it: stop instead.
                    Ok(m) => return Err(RunError::UnsplitPartition {
                        partition: m.partition(),
                        offset: m.offset(),
                    }),
                    Err(KafkaError::PartitionEOF(_)) => {}
                    Err(e) if outage::is_connection_error(&e) => {
                        self.consumer.context().stats.kafka_outage.error(&e)
                    }
                    Err(e) => tracing::warn!("kafka: {e}"),
                },
            }
        }
    }

    /// Stops every worker (each commits what it read), commits stored offsets synchronously.
    pub(crate) async fn shutdown(&self) {
        self.consumer.context().stop_all().await;
        commit_stored(&self.consumer, CommitMode::Sync);
    }
}

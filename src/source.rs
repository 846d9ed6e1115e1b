//! The seam between a broker and the pipeline: where records come from, and where the
//! acknowledgement of what committed goes.
//!
//! A source ([`Source`]) delivers records partition by partition. For each partition (Kafka's
//! partition; a queue, a stream) it is given, it asks the pipeline for a run
//! ([`Partitions::start`]), hands that run the partition's records in order as a stream of
//! [`Input`]s, and gets back, through its own [`OffsetSink`], the position after the last record
//! of every batch that committed. When it takes a partition away (a revoke, a closed channel,
//! shutdown) it cancels the run's `stop` and waits for it: the run commits what it read first.
//! A source may give up waiting (Kafka's revoke after `--revoke-timeout`) and drop the run in the
//! middle of a COMMIT: that batch's outcome is then unknown, and the partition's next run starts
//! from the database's position, which says. It starts no new run of a partition before the
//! previous one has ended. Everything broker-specific sits behind this seam (`kafka`: the group
//! member, assignment, positions in Kafka and in the database, topic ids, `--exit-on-eof`, the
//! start-up probe); the batcher, the decoder, the inbox transaction, the handler and the dead
//! letters do not change from one source to another.
//!
//! Invariant: a source hands the pipeline each partition's records in order, on one stream per
//! partition, and learns that a position is done only after the database committed it.
//!
//! # What a source must provide
//!
//! The names the pipeline keys by: a record's `topic` is the ordered stream's name (Kafka's
//! topic, the RabbitMQ queue, the JetStream stream), its `partition` the unit of order within it
//! (Kafka's partition; 0 for a queue or a stream read as one), and the reader whose positions the
//! database holds (`consumer_offsets.group_id`) is Kafka's group id, a queue's or a durable
//! JetStream consumer's name.
//!
//! - **A stream of records per ordering unit**, each a [`RawMessage`] (any bytes in any field):
//!   Kafka's partition; a RabbitMQ queue read by one consumer at a time (single active consumer);
//!   a JetStream stream through one consumer. Order holds within the unit only.
//! - **A position per record** (`RawMessage::offset`) that increases within a run and is never
//!   given to two records that both commit: the offset tracker ([`OffsetSink::store`] gets the
//!   position after a batch's last record), the worker's gap check (a position that goes back
//!   within a run stops the processor: Kafka's topic was re-created), the `dead_letters` key
//!   `(topic, partition, "offset")` with the redrive's lock and delete, the positions in the
//!   database (`consumer_offsets`, module [`positions`]) and the keys derived from positions
//!   ([`key::position_key`]) are keyed by it.
//!   - Kafka: the offset.
//!   - NATS JetStream: the stream sequence. It is a position to resume from, as Kafka's offset
//!     is: a restored database makes the consumer start again at its sequence. JetStream
//!     redelivers a message whose ack is late (`AckWait`) with its own sequence, after later
//!     ones: the source drops a delivery whose sequence is below the next one it handed the run
//!     (the run holds it, and acknowledges it once it commits), and keeps a batch that takes long
//!     alive with in-progress acks (`+WPI`) so that it is not redelivered meanwhile.
//!   - RabbitMQ has none: a delivery tag counts one channel's deliveries, and a redelivery gets a
//!     new one. The source numbers the deliveries itself, from the next position the database
//!     holds for the queue when the channel opens, read once the previous run has ended
//!     (position = that base + tag − 1); the batch's transaction stores the number after its last
//!     record as it does Kafka's offset. A number is used again only by a channel opened after the
//!     last one's deliveries went back to the queue uncommitted, so no two committed records share
//!     one. A channel is a partition's assignment: when it closes the run stops and a new channel
//!     starts a new run. One record may get several numbers (one per delivery): keys derived
//!     from positions would differ between its deliveries, so a queue source refuses
//!     `--id-from position` and dead-letters a record without an id (`missing_id`), and a bad
//!     record delivered again after its channel closed uncommitted may be dead-lettered once per
//!     delivery.
//! - **An acknowledgement after COMMIT** ([`OffsetSink::store`], called only once the database
//!   committed every record before the position): Kafka's offset store and commit; JetStream's
//!   ack of the batch's last message with `AckPolicy::All`; RabbitMQ's `basic.ack` with
//!   `multiple=true` up to the batch's last delivery tag (position − base + 1) on the channel that
//!   delivered it, never on another one, and a channel carries exactly one consumer (a multiple
//!   ack covers every delivery of the channel). `store` is called from the partition's task and
//!   must not wait on the network: a client whose ack is asynchronous (lapin, async-nats) hands
//!   it to a task of its own, in order, and a refused ack is logged and counted
//!   (`offsets_refused`): what it covered is redelivered and skipped by the inbox.
//! - **Redelivery of what was not acknowledged**: Kafka from the committed offset; JetStream after
//!   `AckWait`; RabbitMQ when the channel closes. The inbox makes a redelivery harmless. A broker
//!   limit on redeliveries drops or parks records the database never saw: a quorum queue's
//!   `delivery-limit` must be off, and RabbitMQ's `consumer_timeout` (which closes the channel of
//!   a delivery unacknowledged for 30 minutes, a partition stalled on the database for one)
//!   longer than an outage the processor rides out; JetStream's `max_deliver` likewise.
//! - **A seek, where the broker can**: after a database went back in time (a restore, a failover
//!   to a replica that lagged) or moved ahead of the run (an operator's `positions set`, a COMMIT
//!   whose answer was lost), [`OffsetSink::rewind`] reads the partition again from the
//!   database's position. Kafka seeks; JetStream makes its consumer start at that sequence; a
//!   queue closes the channel (every unacknowledged delivery goes back to the queue) and opens a
//!   new one numbered from the database's position. A queue cannot replay what it acknowledged:
//!   records acknowledged after the database's backup are gone from it, and it refuses a rewind
//!   below its last acknowledgement (the default refuses every rewind), which stops the
//!   processor.
//! - **Around the run** (the service's, `crate::service`; Kafka's is called there directly
//!   today): a start-up probe that tells refused credentials, a failed handshake, a missing
//!   permission and no broker apart within the start-up timeout (Kafka's
//!   `KafkaSettings::probe`), and how long the broker keeps a record, which the dedup-window guard
//!   compares with the inbox retention (Kafka's `retention.ms`, `maintenance::retention::topic`;
//!   a JetStream stream's `max_age`; a queue keeps a record until it is acknowledged, so a
//!   redelivery is never older than the oldest unacknowledged delivery).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;

pub(crate) mod amqp;
pub(crate) mod kafka;
pub mod key;
pub(crate) mod nats;
pub(crate) mod positions;
pub(crate) mod record;

pub(crate) use record::{Header, RawMessage};

/// What a partition's source yields.
#[derive(Debug)]
pub enum Input {
    /// A record.
    Record(RawMessage),
    /// The partition's end was reached (no more records for now).
    Eof,
    /// A consumer error for this partition; the client keeps going.
    Error(String),
}

/// Where committed positions go: the source's acknowledgement (Kafka's offset store in
/// production).
pub trait OffsetSink: Send + Sync + 'static {
    /// Stores `next_offset` as the partition's position to commit: every record before it is
    /// committed in the database.
    fn store(&self, topic: &str, partition: i32, next_offset: i64) -> Result<(), String>;

    /// Moves the partition's source back (or forward) so that its next record is the one at
    /// `next_offset` (`None`: the partition's first record), and makes the source's committed
    /// position follow: the database's position after it went back in time. A source that
    /// cannot seek refuses, and the worker stops.
    fn rewind(&self, topic: &str, partition: i32, next_offset: Option<i64>) -> Result<(), String> {
        let _ = (topic, partition, next_offset);
        Err("this source cannot move a partition's position".to_owned())
    }

    /// The source's position in the partition: the offset after the last record or marker it
    /// read (past a transaction's control records, which carry no message). `None`: unknown.
    fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        let _ = (topic, partition);
        None
    }
}

/// The pipeline's side of the seam: what a source calls for each partition it is given.
pub(crate) trait Partitions: Send + Sync + 'static {
    /// A run for `partition` of `topic`, whose first record is at `start` (the database's
    /// position, when the source took it from there; `None`: the source's own), acknowledging
    /// through `ack`. The source drives it with the partition's records.
    fn start(
        &self,
        topic: Arc<str>,
        partition: i32,
        start: Option<i64>,
        ack: Arc<dyn OffsetSink>,
    ) -> PartitionRun;
}

/// One partition's run, as a source holds it.
pub(crate) struct PartitionRun {
    /// Cancelled by the source to take the partition away: the run commits what it read and
    /// ends.
    pub stop: CancellationToken,
    /// Set while every record read so far is committed and the source reported the end.
    pub at_eof: Arc<AtomicBool>,
    /// Reads the partition's records until they end or `stop`.
    pub run: Box<dyn RunPartition>,
}

/// The body of a [`PartitionRun`].
pub(crate) trait RunPartition: Send {
    /// Applies `input` (one partition's records, in order) until it ends or the run is
    /// stopped. An error stops the processor.
    fn run<'a>(self: Box<Self>, input: BoxStream<'a, Input>)
        -> BoxFuture<'a, Result<(), RunError>>;
}

/// A broker as the processor runs it.
pub(crate) trait Source {
    /// Delivers records to `partitions` until `shutdown` resolves, a run fails, or the source
    /// is done (Kafka's `--exit-on-eof`); then stops every run (each commits what it read) and
    /// acknowledges what committed.
    async fn run(
        self,
        partitions: Arc<dyn Partitions>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), RunError>;
}

//! The seam between a broker and the pipeline: where records come from, and where the
//! acknowledgement of what committed goes.
//!
//! A source ([`Source`]) delivers records partition by partition. For each partition (Kafka's
//! partition; a queue, a stream) it is given, it asks the pipeline for a run
//! ([`Partitions::start`]), hands that run the partition's records in order as a stream of
//! [`Input`]s, and gets back, through its own [`OffsetSink`], the position after the last record
//! of every batch that committed. When it takes a partition away (a revoke, a closed channel,
//! shutdown) it cancels the run's `stop` and waits for it: the run commits what it read first.
//! Everything broker-specific sits behind this seam (`kafka`: the group member, assignment,
//! positions in Kafka and in the database, topic ids, `--exit-on-eof`, the start-up probe); the
//! batcher, the decoder, the inbox transaction, the handler and the dead letters do not change
//! from one source to another.
//!
//! Invariant: a source hands the pipeline each partition's records in order, on one stream per
//! partition, and learns that a position is done only after the database committed it.
//!
//! # What a source must provide
//!
//! - **A stream of records per ordering unit**, each a [`RawMessage`] (any bytes in any field):
//!   Kafka's partition; a RabbitMQ queue read by one consumer at a time (single active consumer);
//!   a JetStream stream through one consumer. Order holds within the unit only.
//! - **A position per record** (`RawMessage::offset`) that increases within the unit and is never
//!   given to two records that both commit: the offset tracker ([`OffsetSink::store`] gets the
//!   position after a batch's last record), the worker's gap check (a position that goes back
//!   stops the partition), the `dead_letters` key `(topic, partition, "offset")` with the
//!   redrive's lock and delete, the positions in the database (`consumer_offsets`, module
//!   [`positions`]) and the keys derived from positions ([`key::position_key`]) are keyed by it.
//!   - Kafka: the offset.
//!   - NATS JetStream: the stream sequence. It is a position to resume from, as Kafka's offset
//!     is: a restored database makes the consumer start again at its sequence.
//!   - RabbitMQ has none: a delivery tag counts one channel's deliveries, and a redelivery gets a
//!     new one. The source numbers the deliveries itself, from the next position the database
//!     holds for the queue when the channel opens (position = that base + tag − 1); the batch's
//!     transaction stores the number after its last record as it does Kafka's offset. A number is
//!     used again only by a channel opened after the last one's deliveries went back to the
//!     queue uncommitted, so no two committed records (dead letters included) share one. A
//!     channel is a partition's assignment: when it closes the run stops and a new channel starts
//!     a new run.
//! - **An acknowledgement after COMMIT** ([`OffsetSink::store`], called only once the database
//!   committed every record before the position): Kafka's offset store and commit; JetStream's
//!   ack of the batch's last message with `AckPolicy::All`; RabbitMQ's `basic.ack` with
//!   `multiple=true` up to the batch's last delivery tag (position − base + 1) on the channel that
//!   delivered it, never on another one.
//! - **Redelivery of what was not acknowledged**: Kafka from the committed offset; JetStream after
//!   `AckWait`; RabbitMQ when the channel closes. The inbox makes a redelivery harmless.
//! - **A seek, where the broker can**: after a database went back in time (a restore, a failover
//!   to a replica that lagged), [`OffsetSink::rewind`] reads the partition again from the
//!   database's position. Kafka seeks; JetStream makes its consumer start at that sequence; a
//!   queue cannot replay what it acknowledged, and refuses (the default), which stops the
//!   partition: records acknowledged after the database's backup are gone from a queue.
//! - **Around the run** (the service's, `crate::service`): a start-up probe that tells refused
//!   credentials, a failed handshake, a missing permission and no broker apart within the
//!   start-up timeout (Kafka's `KafkaSettings::probe`), and how long the broker keeps a record,
//!   which the dedup-window guard compares with the inbox retention (Kafka's `retention.ms`,
//!   `maintenance::retention::topic`; a JetStream stream's `max_age`; a queue keeps a record
//!   until it is acknowledged, so a redelivery is never older than the oldest unacknowledged
//!   delivery).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;

pub(crate) mod kafka;
pub mod key;
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

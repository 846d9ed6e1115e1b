//! The root's errors: the processor's ([`RunError`]) and how an error is said on one line
//! ([`one_line_error`]).
//!
//! Each stage's error is its own module's: the database's ([`DbError`], `db`), the Kafka probe's
//! (`KafkaStartupError`, `source::kafka::consumer`), the SQL handler's, the redrive's, the
//! retention's, the positions', the listener's, the service's; the crate root re-exports every
//! one at `batch_inbox::*Error`. The few defined here are here because the module graph
//! (`scripts/module-graph.py --check`: no circle) leaves them no other place, each said at its
//! definition: `RunError` wraps them, and the source, below the pipeline, returns them.
//!
//! Classification is by SQLSTATE and error kind, never by message text ([`Fault`], the leaf
//! `fault`).

use deadpool_postgres::PoolError;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use tokio_postgres::error::SqlState;

use crate::db::DbError;
use crate::fault::{classify_db, Fault};
use crate::one_line::{chain, pg_line, pool_line};
use crate::secret::{scrub, sensitive_values};

/// `error` on one line, each cause once, as the binary prints it: a wrapper that displays its
/// cause is not repeated, and a PostgreSQL error is said by its server message (no `db error:
/// db error: ERROR: …`), its detail and hint on the same line.
pub fn one_line_error(error: &(dyn std::error::Error + 'static)) -> String {
    chain(error)
}

/// Failure of a handler's business logic.
///
/// The handler trait's (`pipeline::handler`), defined here because [`InboxError`] wraps it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// A statement the handler ran failed; classified by its SQLSTATE (the table of [`Fault`]).
    #[error("handler statement failed: {}", pg_line(.0))]
    Db(#[from] tokio_postgres::Error),
    /// The handler says a message of the batch is bad: the batch is bisected and that message
    /// dead-lettered. (A message the handler refuses on purpose is a
    /// [`crate::pipeline::handler::Rejection`], not an error.)
    #[error("handler refused a message: {0}")]
    Message(Box<dyn std::error::Error + Send + Sync>),
    /// The handler says the environment is wrong (a setting, a service, its own bug): the
    /// partition stalls until a retry succeeds.
    #[error("handler environment: {0}")]
    Environment(Box<dyn std::error::Error + Send + Sync>),
    /// Any other failure of the handler: taken for the environment's (it stalls), since a
    /// handler's own error is the message's fault only if the handler says so.
    #[error("handler failed: {0}")]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl HandlerError {
    /// Whose fault it is.
    pub fn fault(&self) -> Fault {
        match self {
            HandlerError::Db(e) => classify_db(e),
            HandlerError::Message(_) => Fault::Message,
            HandlerError::Environment(_) | HandlerError::Other(_) => Fault::Environment,
        }
    }

    /// Whether retrying the batch soon may succeed.
    pub fn is_retryable(&self) -> bool {
        self.fault() == Fault::Transient
    }

    /// The SQLSTATE of a database error, if it is one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            HandlerError::Db(e) => e.code().map(SqlState::code),
            _ => None,
        }
    }
}

/// Failure of one inbox transaction (dedup, handler, dead letters, commit).
///
/// The inbox's (`pipeline::inbox`), defined here because [`RunError`] wraps it and the source,
/// below the pipeline, returns both (the partitions' positions are read with it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// No connection could be had from the pool.
    #[error("database pool: {}", pool_line(.0))]
    Pool(#[from] PoolError),
    /// An inbox statement or the COMMIT failed.
    #[error("database: {}", pg_line(.0))]
    Db(#[from] tokio_postgres::Error),
    /// The statement writing the batch's dead letters failed.
    #[error("dead letters: {}", pg_line(.0))]
    DeadLetters(tokio_postgres::Error),
    /// The handler failed; the batch was rolled back.
    #[error(transparent)]
    Handler(#[from] HandlerError),
    /// The database did not answer the transaction within its deadline (twice the statement
    /// timeout: a black-holed connection); the connection was dropped. The outcome of a COMMIT
    /// in flight is unknown, which the inbox makes safe to retry.
    #[error("no answer from the database within {} ms: connection dropped", .0.as_millis())]
    TimedOut(std::time::Duration),
    /// The partition's position in `consumer_offsets` is not the one this member committed
    /// last (`expected`; `None`: it knew none and the row was ahead): the database went back in
    /// time (a restore, a failover to a replica that lagged) or another member moved it. The
    /// transaction was rolled back; the worker starts again from the database's position.
    #[error(
        "the partition's position in the database is not the one this member committed ({}): \
         the database went back or another member moved it",
        .expected.map_or_else(|| "none".to_owned(), |e| e.to_string())
    )]
    PositionMoved {
        /// The position this member expected the row to hold.
        expected: Option<i64>,
    },
}

impl InboxError {
    /// Whether retrying the batch soon may succeed. A failed COMMIT whose outcome is unknown is
    /// retryable: the inbox makes re-processing safe.
    pub fn is_retryable(&self) -> bool {
        self.fault() == Fault::Transient
    }

    /// Whose fault it is ([`Fault`]). A statement of the transaction or its COMMIT (a deferred
    /// constraint of the user's) is classified by SQLSTATE: the inbox's insert skips a concurrent
    /// copy of an id without an error, so a unique violation is always the data's. Connecting and
    /// the dead-letter insert (which falls back to a minimal row on bad data) fail for the
    /// environment or transiently, never for a message.
    pub fn fault(&self) -> Fault {
        let environment_unless_transient = |e: &tokio_postgres::Error| match classify_db(e) {
            Fault::Transient => Fault::Transient,
            Fault::Message | Fault::Environment => Fault::Environment,
        };
        match self {
            InboxError::Pool(PoolError::Backend(e)) => environment_unless_transient(e),
            InboxError::Pool(PoolError::Closed | PoolError::NoRuntimeSpecified) => {
                Fault::Environment
            }
            InboxError::Pool(_) => Fault::Transient,
            InboxError::Db(e) => classify_db(e),
            InboxError::DeadLetters(e) => environment_unless_transient(e),
            InboxError::Handler(e) => e.fault(),
            InboxError::TimedOut(_) | InboxError::PositionMoved { .. } => Fault::Transient,
        }
    }

    /// Whether the transaction ran out of time: a statement cancelled by `statement_timeout`
    /// (57014, also a cancel by an operator) or no answer within the client's deadline. Retried;
    /// a batch that keeps timing out is bisected, and a single message that still does stalls
    /// its partition (a slow database is not the message's fault).
    pub fn is_timeout(&self) -> bool {
        matches!(self, InboxError::TimedOut(_))
            || self.sqlstate() == Some(SqlState::QUERY_CANCELED.code())
    }

    /// The SQLSTATE of the database error behind it, if any (for logs and metric labels).
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            InboxError::Pool(PoolError::Backend(e))
            | InboxError::Db(e)
            | InboxError::DeadLetters(e) => e.code().map(SqlState::code),
            InboxError::Handler(h) => h.sqlstate(),
            InboxError::Pool(_) | InboxError::TimedOut(_) | InboxError::PositionMoved { .. } => {
                None
            }
        }
    }
}

impl InboxError {
    /// Whether the connection the transaction ran on may be unusable: closed, a connection
    /// exception (class 08), the server ending the session (class 57: admin shutdown, crash), or an
    /// I/O failure.
    pub fn breaks_connection(&self) -> bool {
        let db = match self {
            InboxError::Db(e)
            | InboxError::DeadLetters(e)
            | InboxError::Handler(HandlerError::Db(e)) => e,
            InboxError::TimedOut(_) => return true,
            InboxError::Pool(_)
            | InboxError::PositionMoved { .. }
            | InboxError::Handler(
                HandlerError::Other(_) | HandlerError::Message(_) | HandlerError::Environment(_),
            ) => return false,
        };
        if db.is_closed() {
            return true;
        }
        match db.code() {
            Some(code) => matches!(&code.code()[..2], "08" | "57"),
            None => std::error::Error::source(db)
                .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()),
        }
    }
}

/// A Kafka client could not be created from its properties.
///
/// Never holds a property's value: librdkafka's own messages quote values (`Invalid value "…"
/// for configuration property "…"`), so a refused property keeps its key and the kind of problem
/// only, and other creation errors have the sensitive values of the properties scrubbed.
///
/// The Kafka consumer's (`source::kafka::consumer`), defined here because [`RunError`] wraps it
/// and the source returns `RunError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaClientError {
    /// librdkafka refused a property.
    #[error("librdkafka property `{key}`: {problem} (its value is not shown)")]
    Property {
        /// The property's name.
        key: String,
        /// `no such property` or `invalid value`.
        problem: &'static str,
    },
    /// librdkafka could not create the client (an unreadable key file, an unsupported
    /// mechanism…).
    #[error("cannot create the Kafka client: {0}")]
    Create(String),
}

impl KafkaClientError {
    /// Maps rdkafka's error from creating a client configured with `properties` (the
    /// user-supplied ones, whose sensitive values are scrubbed from librdkafka's text).
    pub fn new(error: KafkaError, properties: &[(String, String)]) -> Self {
        match error {
            KafkaError::ClientConfig(result, _, key, _) => Self::Property {
                key,
                problem: match result {
                    RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN => "no such property",
                    _ => "invalid value",
                },
            },
            other => Self::Create(scrub(&other.to_string(), sensitive_values(properties))),
        }
    }
}

/// Failure of the processor as a whole.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Kafka client failure (subscription, commit at shutdown).
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The Kafka client could not be created from its properties.
    #[error(transparent)]
    KafkaClient(#[from] KafkaClientError),
    /// A librdkafka setting would break the guarantee; nothing was consumed.
    #[error(transparent)]
    Refused(#[from] RefusedSetting),
    /// RabbitMQ refused a setting, the login or a queue's declaration.
    #[error(transparent)]
    Amqp(#[from] AmqpError),
    /// NATS JetStream refused a setting, the login, the stream or the consumer.
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// A batch failed for a reason retrying cannot fix; its offsets were not committed.
    #[error("batch of {topic}/{partition} at offset {offset} failed: {source}")]
    Batch {
        /// Topic of the batch.
        topic: String,
        /// Partition of the batch.
        partition: i32,
        /// First offset of the batch.
        offset: i64,
        /// The failure.
        source: InboxError,
    },
    /// A partition worker panicked (a bug); nothing after its last committed batch was stored.
    #[error("partition worker of {topic}/{partition} panicked: {message}")]
    WorkerPanic {
        /// Topic of the partition.
        topic: String,
        /// The partition.
        partition: i32,
        /// The panic's message.
        message: String,
    },
    /// A record arrived outside its partition's queue; nothing was stored for it.
    #[error("record of partition {partition} at offset {offset} arrived on the main queue")]
    UnsplitPartition {
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
    },
    /// The database could not be reached or prepared (its error says so).
    #[error(transparent)]
    Db(#[from] DbError),
    /// A partition's records went back to an offset below the next one expected: the client
    /// reset its position to the start of another log (the topic deleted and re-created, or the
    /// log truncated). Nothing from that offset on was applied or committed.
    #[error(
        "{topic}/{partition} went back from offset {expected} to {received}: the topic was \
         deleted and re-created, or its log truncated; nothing of it was applied. Start again: \
         a re-created topic is then reported with its ids"
    )]
    OffsetsWentBack {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset expected.
        expected: i64,
        /// The offset received.
        received: i64,
    },
    /// The partition's position in the database is not the one this member committed last
    /// (`expected`; the database's is `stored`, `None`: no row or not read yet): the database
    /// went back in time or another member moved it. A partition worker handles it by moving
    /// to the database's position; it stops the processor only when the source cannot move.
    #[error(
        "{topic}/{partition}: the database holds position {}, this member had committed {}: \
         the database went back in time (a restore, a failover) or another member moved it",
        .stored.map_or_else(|| "none".to_owned(), |s| s.to_string()),
        .expected.map_or_else(|| "none".to_owned(), |e| e.to_string())
    )]
    PositionMoved {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The position this member had committed (or started from).
        expected: Option<i64>,
        /// The position the database holds.
        stored: Option<i64>,
    },
    /// The positions of an assignment could not be read from the database (it kept failing):
    /// nothing of it was consumed. Kafka's committed offsets may be ahead of the database (a
    /// restore, a failover), so starting there could skip records; start again once the
    /// database answers.
    #[error(
        "cannot read the assigned partitions' positions in the database ({detail}): nothing was \
         consumed; start again once the database answers"
    )]
    PositionsUnread {
        /// Why.
        detail: String,
    },
    /// A topic was deleted and re-created: the group's offsets in the database belong to the
    /// old one (another topic id), and starting there would skip the new topic's records.
    /// Nothing of the new topic was consumed.
    #[error(
        "topic {topic} was deleted and re-created: the offsets of group {group} in the database \
         belong to topic id {stored}, the broker's topic has id {current}, and starting there \
         would skip the new topic's records. To consume the new topic from its start, remove the \
         old offsets and the inbox rows keyed by the old topic's positions ({reset}), set the \
         group's positions of the new topic in the database (batch-inbox positions set --group \
         {group} --topic {topic} --to-earliest --reason ...) and start again"
    )]
    TopicReplaced {
        /// The topic.
        topic: String,
        /// The consumer group.
        group: String,
        /// The id the stored offsets belong to.
        stored: uuid::Uuid,
        /// The broker's id of the topic now.
        current: uuid::Uuid,
        /// The SQL that removes the old offsets, the recorded topic id and the inbox rows keyed
        /// by the old topic's positions.
        reset: String,
    },
}

/// A setting refused by a rule of the consumer's settings check. Like every configuration error, it names the property, never
/// its value.
///
/// The Kafka consumer's (`source::kafka::consumer::refused`), defined here because [`RunError`]
/// wraps it and the source returns `RunError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused -X {key} (safe: {safe}): {reason}")]
pub struct RefusedSetting {
    /// The property.
    pub key: &'static str,
    /// Its safe values, in words.
    pub safe: &'static str,
    /// Why other values are refused.
    pub reason: &'static str,
}

/// Why the RabbitMQ source refused to start or stopped.
///
/// The queue source's (`source::amqp`), defined here because [`RunError`] wraps it and the
/// source returns `RunError`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// A setting the source cannot run with.
    #[error("rabbitmq: {0}")]
    Settings(String),
    /// The broker refused the login, the vhost, a permission or a queue's declaration: retrying
    /// does not help.
    #[error("rabbitmq refused: {0}")]
    Refused(String),
    /// The broker could not be reached, or the connection failed.
    #[error("rabbitmq: {0}")]
    Unreachable(String),
    /// The broker said a queue is not there (`NOT_FOUND`): refused at start; once a queue was
    /// read, waited for (a clustered queue whose node is down answers so until it is back).
    #[error("rabbitmq: {0}")]
    NotFound(String),
}

/// Why the NATS JetStream source refused to start or stopped (module `source::nats`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// A setting the source cannot run with, or a stream or consumer setting that can lose
    /// messages.
    #[error("nats: {0}")]
    Settings(String),
    /// The server refused the login or a JetStream request: retrying does not help.
    #[error("nats refused: {0}")]
    Refused(String),
    /// The server could not be reached, the connection failed, or a request got no answer.
    #[error("nats: {0}")]
    Unreachable(String),
}

impl NatsError {
    /// Whether retrying cannot help.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(self, NatsError::Refused(_) | NatsError::Settings(_))
    }
}

impl AmqpError {
    /// Whether retrying cannot help.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(
            self,
            AmqpError::Refused(_) | AmqpError::Settings(_) | AmqpError::NotFound(_)
        )
    }
}

#[cfg(test)]
mod tests;

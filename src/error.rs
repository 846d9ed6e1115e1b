//! Error types, one per boundary, each able to say whether retrying can help.
//!
//! Classification is by SQLSTATE and error kind, never by message text.

use deadpool_postgres::PoolError;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use tokio_postgres::error::SqlState;

use crate::secret::{scrub, sensitive_values};

/// True when a PostgreSQL error is transient: the same work may succeed when retried.
pub fn is_retryable_db(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    match err.code() {
        Some(code) => is_retryable_state(code),
        // No SQLSTATE: a client-side failure. I/O failures (connection reset, refused) are
        // transient; conversion errors are bugs and are not.
        None => std::error::Error::source(err)
            .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()),
    }
}

fn is_retryable_state(code: &SqlState) -> bool {
    let class = &code.code()[..2];
    // 08: connection exception; 40: transaction rollback (serialization failure, deadlock);
    // 53: insufficient resources; 57: operator intervention (admin shutdown, crash, starting up).
    matches!(class, "08" | "40" | "53" | "57") || *code == SqlState::LOCK_NOT_AVAILABLE
}

/// Failure of a handler's business logic.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// A statement the handler ran failed.
    #[error("handler statement failed: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// Any other failure of the handler.
    #[error("handler failed: {0}")]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl HandlerError {
    /// Whether retrying the batch may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            HandlerError::Db(e) => is_retryable_db(e),
            HandlerError::Other(_) => false,
        }
    }
}

/// Failure of one inbox transaction (dedup, handler, dead letters, commit).
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// No connection could be had from the pool.
    #[error("database pool: {0}")]
    Pool(#[from] PoolError),
    /// An inbox statement or the COMMIT failed.
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// The statement writing the batch's dead letters failed.
    #[error("dead letters: {0}")]
    DeadLetters(tokio_postgres::Error),
    /// The handler failed; the batch was rolled back.
    #[error(transparent)]
    Handler(#[from] HandlerError),
}

impl InboxError {
    /// Whether retrying the batch may succeed. A failed COMMIT whose outcome is unknown is
    /// retryable: the inbox makes re-processing safe.
    pub fn is_retryable(&self) -> bool {
        match self {
            InboxError::Pool(PoolError::Backend(e)) => is_retryable_db(e),
            InboxError::Pool(PoolError::Closed | PoolError::NoRuntimeSpecified) => false,
            InboxError::Pool(_) => true,
            InboxError::Db(e) => is_retryable_db(e) || self.is_concurrent_insert(),
            InboxError::DeadLetters(e) => is_retryable_db(e),
            InboxError::Handler(e) => e.is_retryable(),
        }
    }

    /// Whether the inbox's own insert met an id that a concurrent transaction committed after
    /// this transaction's snapshot (a unique violation: the inbox's statements conflict on no
    /// other key). Run again, the transaction sees that id as a duplicate.
    pub fn is_concurrent_insert(&self) -> bool {
        matches!(self, InboxError::Db(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION))
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
            InboxError::Pool(_) | InboxError::Handler(HandlerError::Other(_)) => return false,
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
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// The database could not be reached or prepared.
    #[error("database: {0}")]
    Db(#[from] DbError),
}

/// Failure to set up the database (pool, migrations).
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The database URL does not parse.
    #[error("invalid database URL: {0}")]
    Url(String),
    /// The pool could not be built.
    #[error("cannot build the connection pool: {0}")]
    Build(String),
    /// TLS to the database could not be set up (`sslmode=require`, `PGSSLROOTCERT`).
    #[error("cannot set up TLS to the database: {0}")]
    Tls(String),
    /// A connection could not be had.
    #[error("cannot connect to the database: {0}")]
    Pool(#[from] PoolError),
    /// A statement failed.
    #[error("database: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The schema is older than this binary.
    #[error(
        "database schema is at version {have}, this binary needs {want}: run `batch-inbox migrate`"
    )]
    Schema {
        /// Latest applied migration.
        have: i32,
        /// Latest known migration.
        want: i32,
    },
}

/// A setting refused by a rule of the consumer's settings check. Like every configuration error, it names the property, never
/// its value.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kafka_client_error_names_the_property_never_its_value() {
        let pw = "Sup3rS3cretPw";
        let refused = KafkaError::ClientConfig(
            RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
            format!("Invalid value \"{pw}\" for configuration property \"fetch.min.bytes\""),
            "fetch.min.bytes".to_owned(),
            pw.to_owned(),
        );
        let e = KafkaClientError::new(refused, &[]);
        assert_eq!(
            e.to_string(),
            "librdkafka property `fetch.min.bytes`: invalid value (its value is not shown)"
        );
        assert!(!format!("{e:?}").contains(pw));
        let unknown = KafkaError::ClientConfig(
            RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
            "No such configuration property: \"sasl.pasword\"".to_owned(),
            "sasl.pasword".to_owned(),
            pw.to_owned(),
        );
        let e = KafkaClientError::new(unknown, &[]);
        assert!(
            e.to_string().contains("`sasl.pasword`: no such property"),
            "{e}"
        );
        let creation = KafkaError::ClientCreation(format!("ssl.key.pem failed: {pw}"));
        let props = [("ssl.key.pem".to_owned(), pw.to_owned())];
        let e = KafkaClientError::new(creation, &props);
        assert!(e.to_string().ends_with("ssl.key.pem failed: ***"), "{e}");
    }

    #[test]
    fn transient_states_are_retryable_and_constraint_violations_are_not() {
        for code in [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::CONNECTION_FAILURE,
            SqlState::TOO_MANY_CONNECTIONS,
        ] {
            assert!(is_retryable_state(&code), "{code:?}");
        }
        for code in [
            SqlState::UNIQUE_VIOLATION,
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
            SqlState::UNDEFINED_TABLE,
            SqlState::SYNTAX_ERROR,
        ] {
            assert!(!is_retryable_state(&code), "{code:?}");
        }
    }
}

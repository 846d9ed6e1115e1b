//! The JetStream API requests the source makes (`$JS.API.…`, JSON), as nats-server 2.9 serves
//! them: a stream's info, a consumer's info, creation and deletion. Fields the source does not
//! know are kept as they came, so that a consumer created again at a sequence keeps the
//! operator's other settings.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::proto::Conn;
use crate::error::NatsError;

/// How long a JetStream API request may take.
pub(crate) const API_TIMEOUT: Duration = Duration::from_secs(5);

/// The part of a stream's configuration the source checks.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct StreamConfig {
    /// `limits`, `interest` or `workqueue`.
    #[serde(default)]
    pub retention: String,
    /// The oldest message's age before it is removed, in nanoseconds (0: none).
    #[serde(default)]
    pub max_age: i64,
    /// Most messages (-1: no limit).
    #[serde(default)]
    pub max_msgs: i64,
    /// Most bytes (-1: no limit).
    #[serde(default)]
    pub max_bytes: i64,
    /// Most messages per subject (-1 or 0: no limit).
    #[serde(default)]
    pub max_msgs_per_subject: i64,
    /// `old` (the oldest go) or `new` (new ones are refused).
    #[serde(default)]
    pub discard: String,
}

/// A stream's state.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(crate) struct StreamState {
    /// Messages stored.
    #[serde(default)]
    pub messages: u64,
    /// The oldest message's sequence.
    #[serde(default)]
    pub first_seq: u64,
}

/// A stream's info.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct StreamInfo {
    /// Its configuration.
    #[serde(default)]
    pub config: StreamConfig,
    /// Its state.
    #[serde(default)]
    pub state: StreamState,
}

/// A consumer's configuration: the fields the source sets or checks, and the others as they are.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ConsumerConfig {
    /// The durable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable_name: Option<String>,
    /// A push consumer's subject (a pull consumer has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_subject: Option<String>,
    /// `all`, `by_start_sequence`, …
    #[serde(default)]
    pub deliver_policy: String,
    /// The first sequence with `by_start_sequence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opt_start_seq: Option<u64>,
    /// `none`, `all` or `explicit`.
    #[serde(default)]
    pub ack_policy: String,
    /// How long a delivery waits for its acknowledgement before it is delivered again, in
    /// nanoseconds.
    #[serde(default)]
    pub ack_wait: i64,
    /// Most deliveries of a message (-1: no limit).
    #[serde(default)]
    pub max_deliver: i64,
    /// Most deliveries unacknowledged at once.
    #[serde(default)]
    pub max_ack_pending: i64,
    /// The subject the consumer reads (empty: the whole stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_subject: Option<String>,
    /// Every other field, as it came.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Sequences of a consumer's progress.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(crate) struct SequenceInfo {
    /// The stream sequence.
    #[serde(default)]
    pub stream_seq: u64,
    /// The consumer sequence (one per delivery, redeliveries included).
    #[serde(default)]
    pub consumer_seq: u64,
}

/// A consumer's info.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ConsumerInfo {
    /// Its configuration.
    #[serde(default)]
    pub config: ConsumerConfig,
    /// The last message delivered.
    #[serde(default)]
    pub delivered: SequenceInfo,
    /// Every message up to this one is acknowledged.
    #[serde(default)]
    pub ack_floor: SequenceInfo,
    /// Delivered and not acknowledged.
    #[serde(default)]
    pub num_ack_pending: u64,
    /// Not delivered yet.
    #[serde(default)]
    pub num_pending: u64,
}

/// An API error (`{"error": {"code": 404, "err_code": 10014, "description": "…"}}`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ApiError {
    /// The HTTP-like code.
    #[serde(default)]
    pub code: u16,
    /// JetStream's own code (10014: consumer not found, 10059: stream not found).
    #[serde(default)]
    pub err_code: u32,
    /// The server's words.
    #[serde(default)]
    pub description: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (code {}, {})",
            self.description, self.code, self.err_code
        )
    }
}

/// An API answer: the error, or the value.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// It answered with the value.
    Ok(T),
    /// It answered with an error.
    Err(ApiError),
}

/// JetStream's code of a stream that is not there.
pub(crate) const STREAM_NOT_FOUND: u32 = 10059;
/// JetStream's code of a consumer that is not there.
pub(crate) const CONSUMER_NOT_FOUND: u32 = 10014;

async fn call<T: for<'de> Deserialize<'de>>(
    conn: &Conn,
    subject: &str,
    body: &[u8],
) -> Result<Answer<T>, NatsError> {
    let msg = conn.request(subject, body, API_TIMEOUT).await?;
    #[derive(Deserialize)]
    struct Error {
        error: Option<ApiError>,
    }
    if let Ok(Error { error: Some(e) }) = serde_json::from_slice::<Error>(&msg.payload) {
        return Ok(Answer::Err(e));
    }
    serde_json::from_slice(&msg.payload)
        .map(Answer::Ok)
        .map_err(|e| NatsError::Unreachable(format!("the answer to {subject}: {e}")))
}

/// The stream's info.
pub(crate) async fn stream_info(
    conn: &Conn,
    stream: &str,
) -> Result<Answer<StreamInfo>, NatsError> {
    call(conn, &format!("$JS.API.STREAM.INFO.{stream}"), b"").await
}

/// The consumer's info.
pub(crate) async fn consumer_info(
    conn: &Conn,
    stream: &str,
    consumer: &str,
) -> Result<Answer<ConsumerInfo>, NatsError> {
    call(
        conn,
        &format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"),
        b"",
    )
    .await
}

/// Creates the durable consumer with `config` (nats-server 2.9's durable create).
pub(crate) async fn create_consumer(
    conn: &Conn,
    stream: &str,
    config: &ConsumerConfig,
) -> Result<Answer<ConsumerInfo>, NatsError> {
    let name = config.durable_name.clone().unwrap_or_default();
    let body = serde_json::json!({ "stream_name": stream, "config": config });
    call(
        conn,
        &format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}"),
        body.to_string().as_bytes(),
    )
    .await
}

/// Deletes the consumer.
pub(crate) async fn delete_consumer(
    conn: &Conn,
    stream: &str,
    consumer: &str,
) -> Result<Answer<Value>, NatsError> {
    call(
        conn,
        &format!("$JS.API.CONSUMER.DELETE.{stream}.{consumer}"),
        b"",
    )
    .await
}

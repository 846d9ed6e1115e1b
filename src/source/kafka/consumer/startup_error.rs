//! The Kafka side's refusal at start: what the probe of the brokers
//! ([`KafkaSettings::probe`](super::KafkaSettings::probe)) found.

use crate::error::KafkaClientError;

/// The Kafka side refused the processor at start (the probe of [`crate::KafkaSettings::probe`]);
/// nothing was consumed. Each reads as one line naming the cause, without any sensitive value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaStartupError {
    /// The client could not be created from its properties.
    #[error(transparent)]
    Client(KafkaClientError),
    /// The brokers refused the credentials.
    #[error(
        "Kafka at {brokers}: SASL authentication failed{}; check sasl.mechanism, sasl.username \
         and sasl.password",
        suffix(detail)
    )]
    Authentication {
        /// The bootstrap servers.
        brokers: String,
        /// librdkafka's reason, scrubbed of sensitive values (may be empty).
        detail: String,
    },
    /// The TLS handshake failed (an unknown certificate authority, a name that does not match).
    #[error(
        "Kafka at {brokers}: TLS handshake failed{}; check ssl.ca.location and the broker's \
         certificate",
        suffix(detail)
    )]
    Tls {
        /// The bootstrap servers.
        brokers: String,
        /// librdkafka's reason, scrubbed of sensitive values (may be empty).
        detail: String,
    },
    /// No broker answered within the start-up timeout.
    #[error(
        "Kafka at {brokers}: no broker answered within {} s ({detail}); check --brokers and \
         security.protocol, or raise --startup-timeout",
        waited.as_secs_f64()
    )]
    Unreachable {
        /// The bootstrap servers.
        brokers: String,
        /// How long the probe waited.
        waited: std::time::Duration,
        /// librdkafka's last failure, scrubbed of sensitive values.
        detail: String,
    },
    /// The principal may not read (or describe) the topic.
    #[error(
        "Kafka topic `{topic}`: authorization failed: the processor's principal needs READ \
         (and DESCRIBE) on the topic"
    )]
    TopicAuthorization {
        /// The topic.
        topic: String,
    },
    /// The principal may not use the consumer group.
    #[error(
        "Kafka consumer group `{group}`: authorization failed: the processor's principal needs \
         READ on the group"
    )]
    GroupAuthorization {
        /// The group.
        group: String,
    },
    /// A request of the probe failed otherwise.
    #[error("Kafka at {brokers}: {detail}")]
    Request {
        /// The bootstrap servers.
        brokers: String,
        /// What failed, scrubbed of sensitive values.
        detail: String,
    },
}

/// ` (detail)`, or nothing when there is none.
fn suffix(detail: &str) -> String {
    match detail.is_empty() {
        true => String::new(),
        false => format!(" ({detail})"),
    }
}

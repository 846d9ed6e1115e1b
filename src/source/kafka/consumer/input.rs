//! Records as the partition workers get them: each borrowed librdkafka message copied into the
//! pipeline's owned [`RawMessage`], whatever its bytes, and a partition queue as a worker's
//! [`Input`] stream.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::Message as _;

use super::{headers, GroupContext};
use crate::observe::stats::Stats;
use crate::observe::telemetry::outage::is_connection_error;
use crate::source::Input;
use crate::source::RawMessage;

/// Copies a borrowed record into the pipeline's owned type. Never panics, whatever its bytes:
/// headers are read as bytes ([`headers::read`]); headers librdkafka cannot parse leave the
/// record without headers and with `header_error` set.
pub(crate) fn to_raw(topic: &Arc<str>, m: &BorrowedMessage<'_>) -> RawMessage {
    let (headers, header_error) = match headers::read(m) {
        Ok(headers) => (headers, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    RawMessage {
        topic: topic.clone(),
        partition: m.partition(),
        offset: m.offset(),
        timestamp_ms: m.timestamp().to_millis(),
        key: m.key().map(Bytes::copy_from_slice),
        payload: m.payload().map(Bytes::copy_from_slice),
        headers,
        header_error,
    }
}

/// The worker's input stream over a partition queue. A fetch Kafka refuses (the topic's READ
/// revoked) stalls the partition visibly in `stats` (the stalled gauge, `/readyz`, one WARN
/// line) until its next record or end: librdkafka retries the fetch, and reports the refusal
/// once. Connection errors go to the member's outage ([`super::outage`]), not to the worker.
pub(crate) fn queue_input(
    topic: Arc<str>,
    partition: i32,
    queue: &StreamPartitionQueue<GroupContext>,
    stats: Arc<Stats>,
) -> impl futures::Stream<Item = Input> + '_ {
    let mut refused = false;
    queue.stream().filter_map(move |r| {
        // Counted by the member's outage, not a line per partition and retry.
        if let Err(e) = &r {
            if is_connection_error(e) {
                stats.kafka_outage.error(e);
                return std::future::ready(None);
            }
        }
        let stalls = &stats.telemetry.stalls;
        let resumes = matches!(r, Ok(_) | Err(KafkaError::PartitionEOF(_)));
        if resumes && std::mem::take(&mut refused) {
            stalls.resumed(&topic, partition);
            tracing::info!(topic = %topic, partition, "Kafka serves the partition's fetches again");
        }
        let input = match r {
            Ok(m) => Input::Record(to_raw(&topic, &m)),
            Err(KafkaError::PartitionEOF(_)) => Input::Eof,
            Err(e) => {
                if let Some(what) = refusal(&e) {
                    refused = true;
                    stalls.kafka_refused(&topic, partition, what);
                    tracing::warn!(
                        topic = %topic, partition,
                        "partition stalled: Kafka refuses its fetches ({what}): grant the \
                         processor's principal READ on the topic; it resumes by itself once \
                         granted, nothing skipped"
                    );
                }
                Input::Error(e.to_string())
            }
        };
        std::future::ready(Some(input))
    })
}

/// What Kafka refused, when a partition error is an authorization failure.
fn refusal(e: &KafkaError) -> Option<&'static str> {
    match e.rdkafka_error_code() {
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => Some("topic authorization failed"),
        _ => None,
    }
}

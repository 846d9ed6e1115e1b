//! Records as the partition workers get them: each borrowed librdkafka message copied into the
//! pipeline's owned [`RawMessage`], whatever its bytes, and a partition queue as a worker's
//! [`Input`] stream.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::Message as _;

use super::{headers, GroupContext};
use crate::message::RawMessage;
use crate::worker::Input;

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

/// The worker's input stream over a partition queue.
pub(crate) fn queue_input(
    topic: Arc<str>,
    queue: &StreamPartitionQueue<GroupContext>,
) -> impl futures::Stream<Item = Input> + '_ {
    queue.stream().map(move |r| match r {
        Ok(m) => Input::Record(to_raw(&topic, &m)),
        Err(KafkaError::PartitionEOF(_)) => Input::Eof,
        Err(e) => Input::Error(e.to_string()),
    })
}

//! The record a source delivers: the one owned type that crosses the pipeline's stages, copied
//! out of the client's borrowed types (rdkafka's today) so that it can be batched and moved
//! between tasks.
//!
//! Records are bytes: header names and values, keys and values may hold any byte sequence
//! (invalid UTF-8, NUL bytes, empty or null values, many headers). Nothing here assumes text;
//! every size saturates.

use std::sync::Arc;

use bytes::Bytes;

/// One header: a name and an optional value, both bytes as received (a Kafka header; a
/// RabbitMQ or NATS header is one too).
///
/// Kafka does not require header names to be UTF-8. librdkafka hands a name out NUL-terminated,
/// so a name that contains a NUL byte arrives cut before its first NUL (`consumer::headers` reads
/// them, and `tests/it/broker_fetch.rs` shows it); values arrive whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Header name, as bytes.
    pub key: Bytes,
    /// Header value; `None` is a null header.
    pub value: Option<Bytes>,
}

impl Header {
    /// What a header counts towards the batch byte limit besides its name and value: the size
    /// of its owned copy (64 bytes on 64-bit targets).
    pub const OVERHEAD_BYTES: usize = std::mem::size_of::<Header>();
}

/// A record as its source delivered it, owned.
///
/// `topic`, `partition` and `offset` are the record's position, which the dead letters, the
/// positions in the database and the keys derived from positions are keyed by: for Kafka the
/// topic, partition and offset; for another source what module `source` says it supplies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawMessage {
    /// Topic it was read from (the source's name of the ordered stream: a queue, a stream).
    pub topic: Arc<str>,
    /// Partition it was read from: the unit of order (0 for a source without partitions).
    pub partition: i32,
    /// Its position in the partition: Kafka's offset, increasing within a partition.
    pub offset: i64,
    /// The record's timestamp in milliseconds since the epoch, when it has one.
    pub timestamp_ms: Option<i64>,
    /// Record key.
    pub key: Option<Bytes>,
    /// Record value.
    pub payload: Option<Bytes>,
    /// Record headers, in order.
    pub headers: Vec<Header>,
    /// Why the record's headers could not be read, when the client refused them (librdkafka
    /// refuses more than 100,000 headers and a malformed header block); `headers` is then empty.
    pub header_error: Option<String>,
}

impl RawMessage {
    /// What a record counts towards the batch byte limit besides its bytes: the size of its owned
    /// copy (more than Kafka's own framing of a record, at most 36 bytes).
    pub const OVERHEAD_BYTES: usize = std::mem::size_of::<RawMessage>();

    /// The value of the first header called `name`, if present and non-null.
    pub fn header(&self, name: &str) -> Option<&Bytes> {
        self.headers
            .iter()
            .find(|h| h.key == name.as_bytes())
            .and_then(|h| h.value.as_ref())
    }

    /// Every header called `name`, in order.
    pub fn headers_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Header> + 'a {
        self.headers
            .iter()
            .filter(move |h| h.key == name.as_bytes())
    }

    /// Size used by the batcher's byte limit: [`RawMessage::OVERHEAD_BYTES`], the key and the
    /// value, and per header [`Header::OVERHEAD_BYTES`], its name and its value. Saturates.
    pub fn size_bytes(&self) -> usize {
        let len = |b: &Option<Bytes>| b.as_ref().map_or(0, Bytes::len);
        let record = Self::OVERHEAD_BYTES
            .saturating_add(len(&self.key))
            .saturating_add(len(&self.payload));
        self.headers.iter().fold(record, |total, h| {
            total
                .saturating_add(Header::OVERHEAD_BYTES)
                .saturating_add(h.key.len())
                .saturating_add(len(&h.value))
        })
    }
}

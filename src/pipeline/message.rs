//! Decoding: a record's id and value become a [`Message`] the handler may see, or a
//! [`DeadLetter`].
//!
//! A [`RawMessage`] is what the source delivered (module `source::record`, re-exported here).
//! [`Decoded`] splits a batch into messages the handler may see ([`Message`]) and
//! [`DeadLetter`]s: decoding never fails the batch and never panics, every message ends as
//! exactly one of the two.
//!
//! Records are bytes: header names and values, keys and values may hold any byte sequence
//! (invalid UTF-8, NUL bytes, empty or null values, many headers). Nothing here assumes text;
//! every arithmetic on a producer-set value (sizes, timestamps) saturates.

use std::sync::Arc;

use uuid::Uuid;

use crate::reason::Reason;

mod id;
mod rules;

pub(crate) use crate::source::key;
pub use crate::source::record::{Header, RawMessage};

pub(crate) use id::clean_text;
#[cfg(test)]
pub(crate) use id::decode_id;
pub(crate) use id::id_text;
pub use id::parse_id;
pub use id::MAX_ID_TEXT_BYTES;
pub use rules::{Decoding, IdFormat, IdRules, IdSource, Tombstones, ValueFormat};

/// A message whose id and payload decoded: what the handler sees.
#[derive(Debug, Clone)]
pub struct Message<P> {
    /// The message's inbox key: its id when that is a UUID, else the key derived from its id or
    /// position ([`IdRules`], module [`key`]).
    pub id: Uuid,
    /// The decoded business payload.
    pub payload: P,
    /// The record it came from (shared: cloning a message is cheap).
    pub raw: Arc<RawMessage>,
}

/// Turns a record's value into a handler's payload type.
pub trait Decode: Sized {
    /// Decodes the payload, or says why it is not acceptable (the dead-letter reason and detail).
    fn decode(raw: &RawMessage) -> Result<Self, (Reason, String)>;

    /// Decodes the payload under `decoding`'s rules. The default dead-letters a tombstone (a
    /// record with no value) when [`Decoding::tombstones`] says so, and calls
    /// [`Decode::decode`] for everything else; a payload type that reads tombstones or other
    /// value formats overrides it.
    fn decode_with(raw: &RawMessage, decoding: &Decoding) -> Result<Self, (Reason, String)> {
        if raw.payload.is_none() && decoding.tombstones == Tombstones::DeadLetter {
            return Err((
                Reason::EmptyPayload,
                "the record has no value (a tombstone)".to_owned(),
            ));
        }
        Self::decode(raw)
    }
}

/// A message that is recorded instead of applied.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The record as delivered.
    pub raw: Arc<RawMessage>,
    /// The id as text: the inbox key when the id decoded, else the id as received when it is
    /// clean text (see `id_text`; it may not be a valid UUID).
    pub message_id: Option<String>,
    /// Why it was not applied.
    pub reason: Reason,
    /// Human-readable detail (the parse error, the balance that was too low).
    pub detail: String,
}

impl DeadLetter {
    /// Builds a dead letter for `raw`.
    pub fn new(
        raw: Arc<RawMessage>,
        message_id: Option<String>,
        reason: Reason,
        detail: String,
    ) -> Self {
        Self {
            raw,
            message_id,
            reason,
            detail,
        }
    }
}

/// A batch split into decodable messages and dead letters, in partition order.
#[derive(Debug)]
pub struct Decoded<P> {
    /// Messages with a valid id and payload.
    pub messages: Vec<Message<P>>,
    /// Messages that cannot be applied, with the reason.
    pub dead_letters: Vec<DeadLetter>,
}

/// Decodes a whole batch with UUID ids from header `id_header` (`decode_batch_with`).
pub fn decode_batch<P: Decode>(batch: Vec<RawMessage>, id_header: &str) -> Decoded<P> {
    decode_batch_with(batch, &Decoding::with_ids(IdRules::header(id_header)))
}

/// Decodes a whole batch under `decoding`: every record becomes either a [`Message`] or a
/// [`DeadLetter`].
pub(crate) fn decode_batch_with<P: Decode>(
    batch: Vec<RawMessage>,
    decoding: &Decoding,
) -> Decoded<P> {
    let mut messages = Vec::with_capacity(batch.len());
    let mut dead_letters = Vec::new();
    for raw in batch {
        let raw = Arc::new(raw);
        let id = decoding.key(&raw);
        // A tombstone to dead-letter is one whatever its id.
        let decoded = match raw.payload.is_none() && decoding.tombstones == Tombstones::DeadLetter {
            true => Err((
                Reason::EmptyPayload,
                "the record has no value (a tombstone)".to_owned(),
            )),
            false => id
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|id| P::decode_with(&raw, decoding).map(|payload| (*id, payload))),
        };
        match decoded {
            Ok((id, payload)) => messages.push(Message { id, payload, raw }),
            Err((reason, detail)) => {
                let id_text = match id {
                    Ok(key) => Some(key.to_string()),
                    Err(_) => decoding
                        .ids
                        .original(&raw)
                        .and_then(id_text)
                        .map(str::to_owned),
                };
                dead_letters.push(DeadLetter::new(raw, id_text, reason, detail));
            }
        }
    }
    Decoded {
        messages,
        dead_letters,
    }
}

/// The dedup-window guard: moves every message whose id is a UUIDv7 created before `oldest_ms`
/// (Unix milliseconds) to the dead letters, reason `outside_dedup_window`: its inbox row may
/// already have been removed by the retention, so it cannot be proven new. Ids of other versions
/// carry no time and pass. Returns how many were moved; dead letters stay in offset order.
pub(crate) fn reject_outside_window<P>(decoded: &mut Decoded<P>, oldest_ms: i64) -> usize {
    let before = decoded.dead_letters.len();
    let (old, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut decoded.messages)
        .into_iter()
        .partition(|m| crate::days::v7_millis(&m.id).is_some_and(|t| t < oldest_ms));
    decoded.messages = kept;
    decoded.dead_letters.extend(old.into_iter().map(|m| {
        let created = crate::days::v7_millis(&m.id).unwrap_or_default();
        let detail = format!(
            "UUIDv7 created at {created} ms since the epoch, before the dedup window's start at \
             {oldest_ms} ms: its inbox row may have expired"
        );
        DeadLetter::new(
            m.raw,
            Some(m.id.to_string()),
            Reason::OutsideDedupWindow,
            detail,
        )
    }));
    decoded.dead_letters.sort_by_key(|d| d.raw.offset);
    decoded.dead_letters.len() - before
}

/// Drops later copies of an id inside one batch, keeping the first occurrence and the order.
/// Returns how many were dropped.
pub fn dedup_in_batch<T>(items: &mut Vec<T>, id: impl Fn(&T) -> Uuid) -> usize {
    let before = items.len();
    let mut seen = std::collections::HashSet::with_capacity(before);
    items.retain(|m| seen.insert(id(m)));
    before - items.len()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Bytes;

    pub(crate) fn raw(offset: i64, id: Option<&str>, payload: &str) -> RawMessage {
        RawMessage {
            topic: Arc::from("t"),
            partition: 0,
            offset,
            timestamp_ms: None,
            key: None,
            payload: Some(Bytes::copy_from_slice(payload.as_bytes())),
            headers: id
                .map(|id| Header {
                    key: Bytes::from_static(b"id"),
                    value: Some(Bytes::copy_from_slice(id.as_bytes())),
                })
                .into_iter()
                .collect(),
            header_error: None,
        }
    }

    struct Text;
    impl Decode for Text {
        fn decode(raw: &RawMessage) -> Result<Self, (Reason, String)> {
            match raw.payload.as_deref() {
                Some(b"bad") => Err((Reason::InvalidPayload, "bad".to_owned())),
                _ => Ok(Text),
            }
        }
    }

    const A: &str = "0191e5a0-0000-7000-8000-000000000001";
    const B: &str = "0191e5a0-0000-7000-8000-000000000002";

    #[test]
    fn every_record_becomes_a_message_or_a_dead_letter() {
        let batch = vec![
            raw(0, Some(A), "ok"),
            raw(1, None, "ok"),
            raw(2, Some("nope"), "ok"),
            raw(3, Some(B), "bad"),
            raw(4, Some(B), "ok"),
        ];
        let d = decode_batch::<Text>(batch, "id");
        let offsets: Vec<i64> = d.messages.iter().map(|m| m.raw.offset).collect();
        assert_eq!(offsets, vec![0, 4]);
        let reasons: Vec<(i64, Reason)> = d
            .dead_letters
            .iter()
            .map(|d| (d.raw.offset, d.reason.clone()))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (1, Reason::MissingId),
                (2, Reason::InvalidId),
                (3, Reason::InvalidPayload)
            ]
        );
        assert_eq!(d.dead_letters[1].message_id.as_deref(), Some("nope"));
    }

    #[test]
    fn another_id_header_can_be_chosen() {
        let mut m = raw(0, None, "ok");
        m.headers.push(Header {
            key: Bytes::from_static(b"ce_id"),
            value: Some(Bytes::from_static(A.as_bytes())),
        });
        assert_eq!(decode_id(&m, "ce_id").unwrap().to_string(), A);
        assert_eq!(decode_id(&m, "id").unwrap_err().0, Reason::MissingId);
    }

    #[test]
    fn the_guard_dead_letters_old_v7_ids_only() {
        let old = "0191e5a0-0000-7000-8000-000000000001"; // 2024-09-10
        let young = "0191e5a1-0000-7000-8000-000000000001";
        let v4 = "00000000-0000-4000-8000-000000000001";
        let mut d = decode_batch::<Text>(
            vec![
                raw(0, Some(old), "ok"),
                raw(1, Some(v4), "ok"),
                raw(2, Some("nope"), "ok"),
                raw(3, Some(young), "ok"),
            ],
            "id",
        );
        let window_start = 0x0191_e5a1_0000_i64;
        assert_eq!(reject_outside_window(&mut d, window_start), 1);
        let offsets: Vec<i64> = d.messages.iter().map(|m| m.raw.offset).collect();
        assert_eq!(offsets, vec![1, 3]);
        let letters: Vec<(i64, Reason)> = d
            .dead_letters
            .iter()
            .map(|l| (l.raw.offset, l.reason.clone()))
            .collect();
        assert_eq!(
            letters,
            vec![(0, Reason::OutsideDedupWindow), (2, Reason::InvalidId)]
        );
        assert_eq!(d.dead_letters[0].message_id.as_deref(), Some(old));
    }

    #[test]
    fn in_batch_dedup_keeps_first_occurrence_in_order() {
        let d = decode_batch::<Text>(
            vec![
                raw(0, Some(A), "ok"),
                raw(1, Some(B), "ok"),
                raw(2, Some(A), "ok"),
                raw(3, Some(B), "ok"),
            ],
            "id",
        );
        let mut msgs = d.messages;
        assert_eq!(dedup_in_batch(&mut msgs, |m| m.id), 2);
        let offsets: Vec<i64> = msgs.iter().map(|m| m.raw.offset).collect();
        assert_eq!(offsets, vec![0, 1]);
    }

    #[test]
    fn an_unclean_or_huge_id_is_refused_with_a_bounded_detail_and_no_id_text() {
        let huge = format!("{}\0", "x".repeat(1_000_000));
        let batch = vec![raw(0, Some("abc\0def"), "ok"), raw(1, Some(&huge), "ok")];
        let d = decode_batch::<Text>(batch, "id");
        assert_eq!(d.dead_letters.len(), 2);
        for letter in &d.dead_letters {
            assert_eq!(letter.reason, Reason::InvalidId);
            assert_eq!(letter.message_id, None, "not clean text: kept raw only");
            assert!(letter.detail.len() < 300, "{}", letter.detail.len());
        }
    }

    #[test]
    fn headers_count_towards_the_byte_limit() {
        let mut m = raw(0, None, "");
        m.payload = None;
        assert_eq!(m.size_bytes(), RawMessage::OVERHEAD_BYTES);
        if cfg!(target_pointer_width = "64") {
            // The figures docs/OPERATIONS.md gives (`--batch-max-bytes`).
            assert_eq!(
                (RawMessage::OVERHEAD_BYTES, Header::OVERHEAD_BYTES),
                (160, 64)
            );
        }
        m.headers = vec![
            Header {
                key: Bytes::new(),
                value: None,
            };
            500_000
        ];
        assert_eq!(
            m.size_bytes(),
            RawMessage::OVERHEAD_BYTES + 500_000 * Header::OVERHEAD_BYTES
        );
        assert!(
            m.size_bytes() > 4 << 20,
            "more than the default batch limit alone"
        );
        m.key = Some(Bytes::from_static(b"kk"));
        m.headers.truncate(1);
        m.headers[0].key = Bytes::from_static(b"abc");
        m.headers[0].value = Some(Bytes::from_static(b"12345"));
        let expected = RawMessage::OVERHEAD_BYTES + 2 + Header::OVERHEAD_BYTES + 3 + 5;
        assert_eq!(m.size_bytes(), expected);
    }
}

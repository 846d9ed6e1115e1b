//! How a record becomes a message: where its id comes from and which ids are accepted
//! ([`IdRules`]), and what a tombstone and a value are ([`Decoding`]).
//!
//! Invariants: the inbox key of a record is a pure function of the record and the rules, so a
//! redelivery, a replay by a new group and a re-drive all find the same key. An id that is UUID
//! text is its own key under every format (UUIDv7 retention keeps working and UUID ids dedup
//! across topics); any other accepted id, and a position, maps to a version-8 key
//! ([`super::key`]) that includes the topic.

use uuid::Uuid;

use super::id::{decode_id, parse_id};
use super::{key, RawMessage};
use crate::reason::Reason;

/// Where a record's id comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IdSource {
    /// The value of the id header ([`IdRules::header`]); the record must carry it exactly once.
    #[default]
    Header,
    /// The record key. On a compacted topic only the first record of each key is ever applied:
    /// every later one is a duplicate of it.
    Key,
    /// The record's position (topic, partition, offset): each record of the log is applied
    /// once, but a producer's resend is a new record, and a topic deleted and re-created reuses
    /// positions.
    Position,
}
crate::names::named!(IdSource {
    Header = "header",
    Key = "key",
    Position = "position"
});

/// Which id values are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IdFormat {
    /// UUID text only (any of its text forms, whitespace around it ignored), neither the nil nor
    /// the max UUID; anything else is an `invalid_id` dead letter.
    #[default]
    Uuid,
    /// Any non-empty value of at most 1024 bytes (`MAX_ANY_ID_BYTES`): UUID text maps to itself
    /// (the nil and the max UUID stay refused), any other value to a version-8 key of the topic
    /// and the exact bytes ([`super::key::id_key`]).
    Any,
}
crate::names::named!(IdFormat {
    Uuid = "uuid",
    Any = "any"
});

/// The longest id [`IdFormat::Any`] accepts, in bytes: ids are names, not documents.
pub(crate) const MAX_ANY_ID_BYTES: usize = 1024;

/// Where ids come from and which are accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdRules {
    /// Where the id comes from.
    pub source: IdSource,
    /// The header that carries it, with [`IdSource::Header`].
    pub header: String,
    /// Which values are ids.
    pub format: IdFormat,
}

impl Default for IdRules {
    /// UUIDs from the header of [`crate::pipeline::defaults::ID_HEADER`].
    fn default() -> Self {
        Self::header(crate::pipeline::defaults::ID_HEADER)
    }
}

impl IdRules {
    /// UUIDs from header `name`.
    pub fn header(name: impl Into<String>) -> Self {
        Self {
            source: IdSource::Header,
            header: name.into(),
            format: IdFormat::Uuid,
        }
    }

    /// The inbox key of `raw`, or why it has none (`missing_id`, `invalid_id`).
    pub fn decode(&self, raw: &RawMessage) -> Result<Uuid, (Reason, String)> {
        match self.source {
            IdSource::Header => match self.format {
                IdFormat::Uuid => decode_id(raw, &self.header),
                IdFormat::Any => {
                    decode_id(raw, &self.header).or_else(|(reason, detail)| {
                        match (reason, raw.header(&self.header)) {
                            // Present once but not a UUID: any bytes are welcome.
                            (Reason::InvalidId, Some(value))
                                if raw.headers_named(&self.header).count() == 1 =>
                            {
                                any_key(&raw.topic, value)
                            }
                            (reason, _) => Err((reason, detail)),
                        }
                    })
                }
            },
            IdSource::Key => match raw.key.as_deref() {
                None => Err((Reason::MissingId, "the record has no key".to_owned())),
                Some(k) => match self.format {
                    IdFormat::Uuid => parse_id(k),
                    IdFormat::Any => any_key(&raw.topic, k),
                },
            },
            IdSource::Position => Ok(key::position_key(&raw.topic, raw.partition, raw.offset)),
        }
    }

    /// The id as the record carries it: the id header's value or the key (`None` for a position,
    /// or when the record lacks it).
    pub fn original<'a>(&self, raw: &'a RawMessage) -> Option<&'a [u8]> {
        match self.source {
            IdSource::Header => raw.header(&self.header).map(|v| &v[..]),
            IdSource::Key => raw.key.as_deref(),
            IdSource::Position => None,
        }
    }
}

/// With [`IdFormat::Any`]: UUID text is itself, other bytes a derived key; the nil and max UUID,
/// an empty and an overlong value are refused.
fn any_key(topic: &str, value: &[u8]) -> Result<Uuid, (Reason, String)> {
    if value.is_empty() {
        return Err((Reason::InvalidId, "the id is empty".to_owned()));
    }
    if value.len() > MAX_ANY_ID_BYTES {
        return Err((
            Reason::InvalidId,
            format!(
                "the id is {} bytes long; at most {MAX_ANY_ID_BYTES} are accepted",
                value.len()
            ),
        ));
    }
    match parse_id(value) {
        Ok(id) => Ok(id),
        Err(refused) if looks_like_uuid(value) => Err(refused),
        Err(_) => Ok(key::id_key(topic, value)),
    }
}

/// Whether `value` parses as a UUID but was refused (the nil or the max UUID): a placeholder
/// stays refused under any format.
fn looks_like_uuid(value: &[u8]) -> bool {
    std::str::from_utf8(value)
        .ok()
        .and_then(|t| Uuid::try_parse(t.trim()).ok())
        .is_some()
}

/// What a record with no value (a tombstone; an empty value is not one) becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Tombstones {
    /// A dead letter, `empty_payload`.
    #[default]
    DeadLetter,
    /// A message like any other, for payload types that read tombstones (the SQL handler's: a
    /// statement can delete by key). Without its id header it takes its key from its position.
    Pass,
}
crate::names::named!(Tombstones {
    DeadLetter = "dead-letter",
    Pass = "pass"
});

/// What a record value is, for payload types that read it in more than one way (the SQL
/// handler's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ValueFormat {
    /// A JSON document.
    #[default]
    Json,
    /// UTF-8 text, passed as a JSON string.
    Text,
    /// Any bytes, passed as `{"hex": "…"}`.
    Bytes,
}
crate::names::named!(ValueFormat {
    Json = "json",
    Text = "text",
    Bytes = "bytes"
});

/// How a batch's records are decoded: their ids, tombstones and values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Decoding {
    /// Where ids come from and which are accepted.
    pub ids: IdRules,
    /// What a tombstone becomes.
    pub tombstones: Tombstones,
    /// What a value is.
    pub values: ValueFormat,
}

impl Decoding {
    /// Today's rules with ids from `rules`.
    pub fn with_ids(rules: IdRules) -> Self {
        Self {
            ids: rules,
            ..Self::default()
        }
    }

    /// The inbox key of `raw`: [`IdRules::decode`], except that a tombstone passed on without
    /// its id header takes the key of its position.
    pub fn key(&self, raw: &RawMessage) -> Result<Uuid, (Reason, String)> {
        let tombstone_without_header = self.tombstones == Tombstones::Pass
            && raw.payload.is_none()
            && self.ids.source == IdSource::Header
            && raw.header_error.is_none()
            && raw.headers_named(&self.ids.header).next().is_none();
        match tombstone_without_header {
            true => Ok(key::position_key(&raw.topic, raw.partition, raw.offset)),
            false => self.ids.decode(raw),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::pipeline::message::tests::raw;

    fn any() -> IdRules {
        let mut r = IdRules::header("id");
        r.format = IdFormat::Any;
        r
    }

    const A: &str = "0191e5a0-0000-7000-8000-000000000001";

    #[test]
    fn any_maps_uuids_to_themselves_and_other_ids_to_topic_keys() {
        let rules = any();
        assert_eq!(rules.decode(&raw(0, Some(A), "")).unwrap().to_string(), A);
        let upper = A.to_uppercase();
        assert_eq!(
            rules.decode(&raw(0, Some(&upper), "")).unwrap().to_string(),
            A
        );
        let k = rules.decode(&raw(0, Some("order-42"), "")).unwrap();
        assert_eq!(k, key::id_key("t", b"order-42"));
        assert_ne!(k, rules.decode(&raw(0, Some("Order-42"), "")).unwrap());
        assert_ne!(k, rules.decode(&raw(0, Some("order-43"), "")).unwrap());
        for refused in ["", "00000000-0000-0000-0000-000000000000"] {
            let (reason, _) = rules.decode(&raw(0, Some(refused), "")).unwrap_err();
            assert_eq!(reason, Reason::InvalidId, "{refused:?}");
        }
        let long = "x".repeat(MAX_ANY_ID_BYTES + 1);
        assert_eq!(
            rules.decode(&raw(0, Some(&long), "")).unwrap_err().0,
            Reason::InvalidId
        );
        let at_limit = "x".repeat(MAX_ANY_ID_BYTES);
        assert!(rules.decode(&raw(0, Some(&at_limit), "")).is_ok());
        assert_eq!(
            rules.decode(&raw(0, None, "")).unwrap_err().0,
            Reason::MissingId
        );
        let mut twice = raw(0, Some("a"), "");
        twice.headers.push(twice.headers[0].clone());
        assert_eq!(rules.decode(&twice).unwrap_err().0, Reason::InvalidId);
    }

    #[test]
    fn any_takes_bytes_that_are_not_text() {
        let mut r = raw(0, None, "");
        r.headers.push(crate::pipeline::message::Header {
            key: Bytes::from_static(b"id"),
            value: Some(Bytes::from_static(b"\xff\x00\x01")),
        });
        assert_eq!(any().decode(&r).unwrap(), key::id_key("t", b"\xff\x00\x01"));
        assert_eq!(
            IdRules::header("id").decode(&r).unwrap_err().0,
            Reason::InvalidId
        );
    }

    #[test]
    fn keys_and_positions_are_sources_too() {
        let mut r = raw(7, None, "");
        r.partition = 2;
        let mut rules = IdRules::header("id");
        rules.source = IdSource::Key;
        assert_eq!(rules.decode(&r).unwrap_err().0, Reason::MissingId);
        r.key = Some(Bytes::from_static(A.as_bytes()));
        assert_eq!(rules.decode(&r).unwrap().to_string(), A);
        r.key = Some(Bytes::from_static(b"customer-9"));
        assert_eq!(rules.decode(&r).unwrap_err().0, Reason::InvalidId);
        rules.format = IdFormat::Any;
        assert_eq!(rules.decode(&r).unwrap(), key::id_key("t", b"customer-9"));
        assert_eq!(rules.original(&r), Some(&b"customer-9"[..]));
        rules.source = IdSource::Position;
        assert_eq!(rules.decode(&r).unwrap(), key::position_key("t", 2, 7));
        assert_eq!(rules.original(&r), None);
    }

    #[test]
    fn a_passed_tombstone_without_its_header_takes_its_position() {
        let mut tomb = raw(5, None, "");
        tomb.payload = None;
        let mut d = Decoding::default();
        assert_eq!(d.key(&tomb).unwrap_err().0, Reason::MissingId);
        d.tombstones = Tombstones::Pass;
        assert_eq!(d.key(&tomb).unwrap(), key::position_key("t", 0, 5));
        let mut with_id = raw(5, Some(A), "");
        with_id.payload = None;
        assert_eq!(d.key(&with_id).unwrap().to_string(), A);
        let empty_value = raw(5, None, "");
        assert_eq!(
            d.key(&empty_value).unwrap_err().0,
            Reason::MissingId,
            "an empty value is not a tombstone"
        );
    }

    #[test]
    fn names_round_trip() {
        for s in ["header", "key", "position"] {
            assert_eq!(s.parse::<IdSource>().unwrap().to_string(), s);
        }
        for s in ["uuid", "any"] {
            assert_eq!(s.parse::<IdFormat>().unwrap().to_string(), s);
        }
        for s in ["pass", "dead-letter"] {
            assert_eq!(s.parse::<Tombstones>().unwrap().to_string(), s);
        }
        for s in ["json", "text", "bytes"] {
            assert_eq!(s.parse::<ValueFormat>().unwrap().to_string(), s);
        }
        assert!("UUID".parse::<IdFormat>().is_err());
    }
}

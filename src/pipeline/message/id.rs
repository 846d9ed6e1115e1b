//! The id rules: which header value is a message id.
//!
//! Invariant: a record has an id only when it carries exactly one header named by the id-header
//! setting, whose value is UUID text (whitespace around it ignored) other than the nil and the
//! max UUID. Anything else is a dead letter (`missing_id`, `invalid_id`) with a bounded detail.

use uuid::Uuid;

use super::RawMessage;
use crate::reason::Reason;

/// Reads the message id from header `id_header`: the record must carry exactly one header of
/// that name, with a value that [`parse_id`] accepts.
pub(crate) fn decode_id(raw: &RawMessage, id_header: &str) -> Result<Uuid, (Reason, String)> {
    if let Some(error) = &raw.header_error {
        return Err((
            Reason::MissingId,
            format!("the record's headers cannot be read ({error}): no id header"),
        ));
    }
    let mut named = raw.headers_named(id_header);
    let first = named.next();
    let more = named.count();
    if more > 0 {
        return Err((
            Reason::InvalidId,
            format!(
                "{} headers named {id_header:?}: a record must carry exactly one",
                more.saturating_add(1)
            ),
        ));
    }
    match first.and_then(|h| h.value.as_ref()) {
        Some(value) => parse_id(value),
        None => Err((
            Reason::MissingId,
            format!("no header named {id_header:?} with a value"),
        )),
    }
}

/// Parses an id header's value: UUID text (surrounding whitespace ignored), neither the nil UUID
/// nor the max UUID (`ffffffff-…`), which are placeholders, not ids: accepting one would make
/// every later record carrying it a duplicate.
pub fn parse_id(value: &[u8]) -> Result<Uuid, (Reason, String)> {
    let text = std::str::from_utf8(value)
        .map_err(|_| (Reason::InvalidId, "id header is not UTF-8".to_owned()))?;
    let id = Uuid::try_parse(text.trim()).map_err(|e| {
        let quoted = quote_prefix(text, 64);
        (Reason::InvalidId, format!("id {quoted} is not a UUID: {e}"))
    })?;
    if id.is_nil() || id.is_max() {
        return Err((
            Reason::InvalidId,
            format!("id {id} is the nil or the max UUID, a placeholder, not an id"),
        ));
    }
    Ok(id)
}

/// `text` quoted and escaped (`{:?}`), cut after `max_chars` characters.
fn quote_prefix(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &text[..end], text.len()),
    }
}

/// Longest id text stored in `message_id`, in bytes (a UUID's text forms take at most 45).
pub const MAX_ID_TEXT_BYTES: usize = 128;

/// `bytes` as the text of `message_id`: valid UTF-8, no NUL, at most [`MAX_ID_TEXT_BYTES`].
pub(crate) fn id_text(bytes: &[u8]) -> Option<&str> {
    if bytes.len() > MAX_ID_TEXT_BYTES {
        return None;
    }
    clean_text(bytes)
}

/// `bytes` as text when PostgreSQL can store it as text: valid UTF-8 without NUL.
pub(crate) fn clean_text(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    (!text.contains('\0')).then_some(text)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::pipeline::message::tests::raw;
    use crate::pipeline::message::Header;

    const A: &str = "0191e5a0-0000-7000-8000-000000000001";

    fn with_headers(headers: &[(&'static [u8], Option<&'static [u8]>)]) -> RawMessage {
        let mut m = raw(0, None, "ok");
        m.headers = headers
            .iter()
            .map(|(k, v)| Header {
                key: Bytes::from_static(k),
                value: v.map(Bytes::from_static),
            })
            .collect();
        m
    }

    #[test]
    fn the_nil_and_the_max_uuid_are_not_ids() {
        for placeholder in [
            "00000000-0000-0000-0000-000000000000",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
            "{00000000-0000-0000-0000-000000000000}",
        ] {
            let (reason, _) = decode_id(&raw(0, Some(placeholder), "ok"), "id").unwrap_err();
            assert_eq!(reason, Reason::InvalidId, "{placeholder}");
        }
        assert!(decode_id(&raw(0, Some(A), "ok"), "id").is_ok());
    }

    #[test]
    fn a_record_with_two_id_headers_has_an_invalid_id() {
        let a: &'static [u8] = A.as_bytes();
        for headers in [
            vec![(&b"id"[..], Some(a)), (&b"id"[..], Some(a))],
            vec![(&b"id"[..], None), (&b"id"[..], Some(a))],
            vec![
                (&b"id"[..], Some(a)),
                (&b"other"[..], Some(a)),
                (&b"id"[..], None),
            ],
        ] {
            let (reason, detail) = decode_id(&with_headers(&headers), "id").unwrap_err();
            assert_eq!(reason, Reason::InvalidId, "{headers:?}");
            assert!(detail.starts_with("2 headers named \"id\""), "{detail}");
        }
        let one = with_headers(&[(b"other", Some(b"x")), (b"id", Some(a))]);
        assert_eq!(decode_id(&one, "id").unwrap().to_string(), A);
    }

    #[test]
    fn unreadable_headers_mean_no_id_and_say_why() {
        let mut m = raw(0, Some(A), "ok");
        m.headers.clear();
        m.header_error = Some("Local: Bad message format".to_owned());
        let (reason, detail) = decode_id(&m, "id").unwrap_err();
        assert_eq!(reason, Reason::MissingId);
        assert!(detail.contains("Bad message format"), "{detail}");
    }
}

//! A JetStream delivery as a record: its headers split into names and values as bytes, its
//! stream sequence and delivery count read from its acknowledgement subject, and the server's
//! status messages told apart from records.
//!
//! A header block is `NATS/1.0[ status[ description]]\r\n` then `name: value\r\n` lines and an
//! empty line. nats-server stores and delivers whatever a publisher sent, so a line is split at
//! its first `:` and both sides kept as bytes: a name may hold any byte but `:`, CR and LF; the
//! value loses the blanks before it (the separator's space, as nats-server reads `Nats-Msg-Id`)
//! and nothing else. A line without a `:` is a header with that name and no value. Nothing in a
//! header block is refused.
//!
//! Invariant: every byte of a name and a value is the publisher's; a record's position is its
//! stream sequence.

use std::sync::Arc;

use bytes::Bytes;

use super::proto::Msg;
use crate::source::{Header, RawMessage};

/// What a JetStream message's acknowledgement subject says of it:
/// `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<timestamp>.<pending>`
/// (and, from nats-server 2.10, a domain and an account hash before the stream and a token
/// after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckInfo {
    /// How many times it was delivered (1: the first).
    pub delivered: u64,
    /// Its stream sequence: its position.
    pub stream_seq: u64,
    /// The consumer's sequence of this delivery: one more for every delivery the consumer makes,
    /// to any reader, redeliveries included (nats-server 2.9.10: three messages delivered, then
    /// delivered again after `ack_wait`, carry consumer sequences 1 to 6).
    pub consumer_seq: u64,
    /// When it was stored, in nanoseconds since the epoch.
    pub timestamp_ns: i64,
}

/// Reads an acknowledgement subject; `None` when `reply` is not one (a status message).
pub(crate) fn ack_info(reply: &[u8]) -> Option<AckInfo> {
    let tokens: Vec<&[u8]> = reply.split(|b| *b == b'.').collect();
    if tokens.len() < 9 || tokens[0] != b"$JS" || tokens[1] != b"ACK" {
        return None;
    }
    // v1 has 9 tokens; v2 (2.10+) 12, with the domain and account hash after ACK.
    let base = match tokens.len() {
        9 => 4,
        n if n >= 11 => 6,
        _ => return None,
    };
    let number = |t: &[u8]| std::str::from_utf8(t).ok()?.parse::<u64>().ok();
    Some(AckInfo {
        delivered: number(tokens[base])?,
        stream_seq: number(tokens[base + 1])?,
        consumer_seq: number(tokens[base + 2])?,
        timestamp_ns: i64::try_from(number(tokens[base + 3])?).ok()?,
    })
}

pub(crate) use super::proto::status;

/// The header lines of a block, as bytes (the first line, `NATS/1.0…`, is not a header).
pub(crate) fn headers(block: &[u8]) -> Vec<Header> {
    let mut lines = block.split(|b| *b == b'\n');
    let _version = lines.next();
    let mut out = Vec::new();
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let header = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let value = &line[i + 1..];
                let start = value
                    .iter()
                    .position(|b| *b != b' ' && *b != b'\t')
                    .unwrap_or(value.len());
                Header {
                    key: Bytes::copy_from_slice(&line[..i]),
                    value: Some(Bytes::copy_from_slice(&value[start..])),
                }
            }
            None => Header {
                key: Bytes::copy_from_slice(line),
                value: None,
            },
        };
        out.push(header);
    }
    out
}

/// The record of a delivery at `info`, from stream `stream`.
pub(crate) fn to_raw(stream: &Arc<str>, info: AckInfo, msg: Msg) -> RawMessage {
    let headers = msg.headers.as_deref().map(headers).unwrap_or_default();
    let timestamp_ms = Some(info.timestamp_ns / 1_000_000);
    let mut raw = RawMessage {
        topic: stream.clone(),
        partition: 0,
        offset: i64::try_from(info.stream_seq).unwrap_or(i64::MAX),
        timestamp_ms,
        key: None,
        payload: Some(msg.payload),
        headers,
        header_error: None,
    };
    // The publisher's send time, when it stamped one (milliseconds, as RabbitMQ's
    // `timestamp_in_ms`): the stream's own time is the store's.
    if let Some(ms) = raw
        .header("timestamp_in_ms")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
    {
        raw.timestamp_ms = Some(ms);
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acknowledgement_subject_gives_the_sequence_and_the_delivery_count() {
        let v1 = ack_info(b"$JS.ACK.ORDERS.bi.3.1042.77.1700000000123456789.12").unwrap();
        assert_eq!(
            v1,
            AckInfo {
                delivered: 3,
                stream_seq: 1042,
                consumer_seq: 77,
                timestamp_ns: 1_700_000_000_123_456_789
            }
        );
        let v2 =
            ack_info(b"$JS.ACK.hub.ACCHASH.ORDERS.bi.1.5.5.1700000000000000000.0.tok").unwrap();
        assert_eq!(v2.stream_seq, 5);
        assert_eq!(ack_info(b"_INBOX.abc"), None);
        assert_eq!(ack_info(b"$JS.ACK.S.C.x.1.1.1.0"), None);
    }

    #[test]
    fn header_names_and_values_keep_their_bytes() {
        let block = b"NATS/1.0\r\nNats-Msg-Id: \xff\xfe\r\nname with space:  v  \r\nno colon\r\n\xc3:\r\ndup: 1\r\ndup: 2\r\n\r\n";
        let h = headers(block);
        let pairs: Vec<(&[u8], Option<&[u8]>)> =
            h.iter().map(|h| (&h.key[..], h.value.as_deref())).collect();
        assert_eq!(
            pairs,
            vec![
                (&b"Nats-Msg-Id"[..], Some(&b"\xff\xfe"[..])),
                (&b"name with space"[..], Some(&b"v  "[..])),
                (&b"no colon"[..], None),
                (&b"\xc3"[..], Some(&b""[..])),
                (&b"dup"[..], Some(&b"1"[..])),
                (&b"dup"[..], Some(&b"2"[..])),
            ]
        );
        assert!(headers(b"").is_empty());
        assert!(headers(b"NATS/1.0\r\n\r\n").is_empty());
    }

    #[test]
    fn a_status_message_is_told_apart() {
        let msg = |h: &'static [u8]| Msg {
            subject: Bytes::from_static(b"_INBOX.x"),
            reply: None,
            headers: Some(Bytes::from_static(h)),
            payload: Bytes::new(),
        };
        assert_eq!(
            status(&msg(
                b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 3\r\n\r\n"
            )),
            Some((408, "Request Timeout".to_owned()))
        );
        assert_eq!(
            status(&msg(b"NATS/1.0 100\r\n\r\n")),
            Some((100, String::new()))
        );
        assert_eq!(status(&msg(b"NATS/1.0\r\nNats-Msg-Id: 1\r\n\r\n")), None);
    }
}

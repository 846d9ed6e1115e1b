//! The NATS client protocol, as much of it as the JetStream source needs: a connection that
//! publishes, subscribes and sends requests, and hands every message over as the bytes the server
//! sent.
//!
//! The source speaks the protocol itself rather than through a client crate because a record's
//! headers are bytes: nats-server stores and delivers any header block a publisher sends, and a
//! client that parses it as UTF-8 text with HTTP-like names (async-nats drops its connection on
//! such a message, `results/nats/async-nats-headers.md`) would receive the same message again
//! after every reconnection, a consumer stopped for good. Here a header block is only split into
//! lines (module `delivery`), never refused.
//!
//! One task reads the socket and routes each `MSG`/`HMSG` to its subscription's channel (and
//! answers the server's `PING`); one task writes what the connection's handles queue, flushing
//! when the queue is empty, so that a batch's acknowledgements go out in few writes. When either
//! ends (a closed socket, a protocol error), the connection is closed: every subscription's
//! channel ends and every request fails, and the source opens a new connection.
//!
//! Invariant: a message is handed over with its subject, reply subject, header block and payload
//! byte for byte as the server framed them; nothing a message holds can close the connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::NatsUrl;
use crate::error::NatsError;

/// The longest control line accepted (`INFO` included): a server's INFO with many URLs stays far
/// below it.
const MAX_CONTROL_LINE: usize = 1 << 20;

/// The largest message accepted: nats-server's own limit for `max_payload` (64 MiB) with room for
/// the headers.
const MAX_MESSAGE: usize = 80 << 20;

/// A message as the server sent it.
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    /// The subject it was published to.
    pub subject: Bytes,
    /// Where an answer goes (a JetStream message's acknowledgement subject).
    pub reply: Option<Bytes>,
    /// The header block (`NATS/1.0…\r\n\r\n`), when it has one.
    pub headers: Option<Bytes>,
    /// The payload.
    pub payload: Bytes,
}

/// What the server said of itself when the connection opened (`INFO`).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub(crate) struct ServerInfo {
    /// The server's version.
    #[serde(default)]
    pub version: String,
    /// Whether it takes headers.
    #[serde(default)]
    pub headers: bool,
    /// Whether it requires TLS.
    #[serde(default)]
    pub tls_required: bool,
}

/// What the write task is given.
enum Out {
    /// Bytes to send.
    Bytes(Bytes),
    /// Told once everything queued before it is written and flushed.
    Flushed(oneshot::Sender<()>),
}

type Routes = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Msg>>>>;
type Pending = Arc<Mutex<HashMap<Bytes, oneshot::Sender<Msg>>>>;

/// An open connection. Cloning shares it.
#[derive(Clone)]
pub(crate) struct Conn {
    out: mpsc::UnboundedSender<Out>,
    routes: Routes,
    pending: Pending,
    next_sid: Arc<AtomicU64>,
    next_request: Arc<AtomicU64>,
    inbox: Arc<str>,
    closed: CancellationToken,
}

/// The subscription id of the request inbox.
const REQUEST_SID: u64 = 1;

impl Conn {
    /// Connects to `url` within `within`: TCP, the server's `INFO`, `CONNECT` with the URL's
    /// credentials, and a `PING` answered (so that a refused login is known here).
    pub(crate) async fn connect(
        url: &NatsUrl,
        name: &str,
        within: Duration,
    ) -> Result<Self, NatsError> {
        match tokio::time::timeout(within, Self::open(url, name)).await {
            Ok(result) => result,
            Err(_) => Err(NatsError::Unreachable(format!(
                "no connection to {} within {} ms",
                url.redacted(),
                within.as_millis()
            ))),
        }
    }

    async fn open(url: &NatsUrl, name: &str) -> Result<Self, NatsError> {
        let target = url.address();
        let unreachable = |e: std::io::Error| {
            NatsError::Unreachable(url.scrub(&format!("{}: {e}", url.redacted())))
        };
        let stream = TcpStream::connect(&target).await.map_err(unreachable)?;
        let _ = stream.set_nodelay(true);
        let (mut reader, writer) = stream.into_split();
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let info = loop {
            if let Some(line) = take_line(&mut buf)? {
                let Some(json) = line.strip_prefix(b"INFO ") else {
                    return Err(NatsError::Unreachable(format!(
                        "{} did not start with INFO: is it a NATS server?",
                        url.redacted()
                    )));
                };
                break serde_json::from_slice::<ServerInfo>(json)
                    .map_err(|e| NatsError::Unreachable(format!("the server's INFO: {e}")))?;
            }
            if reader.read_buf(&mut buf).await.map_err(unreachable)? == 0 {
                return Err(NatsError::Unreachable(format!(
                    "{} closed the connection before its INFO",
                    url.redacted()
                )));
            }
        };
        if info.tls_required || url.tls() {
            return Err(NatsError::Settings(format!(
                "{} requires TLS, which this source does not speak yet: use a plain listener \
                 on a private network",
                url.redacted()
            )));
        }
        if !info.headers {
            return Err(NatsError::Settings(format!(
                "the server (version {}) does not support headers; JetStream needs 2.2 or later",
                info.version
            )));
        }
        let mut connect = serde_json::json!({
            "verbose": false,
            "pedantic": false,
            "tls_required": false,
            "name": name,
            "lang": "rust",
            "version": env!("CARGO_PKG_VERSION"),
            "protocol": 1,
            "headers": true,
            "no_responders": true,
            "echo": false,
        });
        if let Some((user, pass)) = url.credentials() {
            match pass {
                Some(pass) => {
                    connect["user"] = user.into();
                    connect["pass"] = pass.into();
                }
                None => connect["auth_token"] = user.into(),
            }
        }
        let mut handshake = BytesMut::new();
        handshake.put_slice(b"CONNECT ");
        handshake.put_slice(connect.to_string().as_bytes());
        handshake.put_slice(b"\r\nPING\r\n");
        let mut writer = BufWriter::with_capacity(64 * 1024, writer);
        writer.write_all(&handshake).await.map_err(unreachable)?;
        writer.flush().await.map_err(unreachable)?;
        // The answer to PING: PONG, or -ERR (a refused login).
        loop {
            while let Some(line) = take_line(&mut buf)? {
                if line.starts_with(b"PONG") {
                    return Ok(Self::start(reader, writer, buf));
                }
                if let Some(err) = line.strip_prefix(b"-ERR") {
                    let text = url.scrub(String::from_utf8_lossy(err).trim());
                    return Err(NatsError::Refused(format!(
                        "{} refused the connection: {text}",
                        url.redacted()
                    )));
                }
                // +OK, INFO updates: nothing to do before the PONG.
            }
            if reader.read_buf(&mut buf).await.map_err(unreachable)? == 0 {
                return Err(NatsError::Unreachable(format!(
                    "{} closed the connection during the handshake",
                    url.redacted()
                )));
            }
        }
    }

    fn start(
        reader: tokio::net::tcp::OwnedReadHalf,
        writer: BufWriter<tokio::net::tcp::OwnedWriteHalf>,
        buf: BytesMut,
    ) -> Self {
        let (out, queue) = mpsc::unbounded_channel();
        let inbox: Arc<str> = Arc::from(format!("_INBOX.{}", uuid::Uuid::new_v4().simple()));
        let conn = Self {
            out,
            routes: Arc::default(),
            pending: Arc::default(),
            next_sid: Arc::new(AtomicU64::new(REQUEST_SID + 1)),
            next_request: Arc::new(AtomicU64::new(1)),
            inbox,
            closed: CancellationToken::new(),
        };
        tokio::spawn(write_loop(writer, queue, conn.closed.clone()));
        tokio::spawn(read_loop(
            reader,
            buf,
            conn.out.clone(),
            conn.routes.clone(),
            conn.pending.clone(),
            conn.closed.clone(),
        ));
        conn.queue(
            format!("SUB {}.* {REQUEST_SID}\r\n", conn.inbox)
                .into_bytes()
                .into(),
        );
        conn
    }

    /// Whether the connection is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Closes the connection (its tasks end, its subscriptions' channels close).
    pub(crate) fn close(&self) {
        self.closed.cancel();
    }

    fn queue(&self, bytes: Bytes) -> bool {
        !self.closed.is_cancelled() && self.out.send(Out::Bytes(bytes)).is_ok()
    }

    /// Returns once everything queued so far is written (or the connection is gone), at most
    /// 5 s.
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.closed.is_cancelled() || self.out.send(Out::Flushed(tx)).is_err() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
    }

    /// Publishes `payload` to `subject` (with `reply`); false when the connection is gone. It is
    /// queued: the write task sends it, in order, with what else is queued.
    pub(crate) fn publish(&self, subject: &[u8], reply: Option<&[u8]>, payload: &[u8]) -> bool {
        let mut b = BytesMut::with_capacity(subject.len() + payload.len() + 48);
        b.put_slice(b"PUB ");
        b.put_slice(subject);
        if let Some(r) = reply {
            b.put_u8(b' ');
            b.put_slice(r);
        }
        b.put_slice(format!(" {}\r\n", payload.len()).as_bytes());
        b.put_slice(payload);
        b.put_slice(b"\r\n");
        self.queue(b.freeze())
    }

    /// A new subscription to `subject`: its messages arrive on the returned channel, which ends
    /// with the connection.
    pub(crate) fn subscribe(&self, subject: &str) -> (u64, mpsc::UnboundedReceiver<Msg>) {
        let sid = self.next_sid.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.routes).insert(sid, tx);
        if !self.queue(format!("SUB {subject} {sid}\r\n").into_bytes().into()) {
            lock(&self.routes).remove(&sid);
        }
        (sid, rx)
    }

    /// A subject of this connection's own that no one else listens on.
    pub(crate) fn new_inbox(&self) -> String {
        // Beside the request inbox's wildcard, not under it: a message is routed once.
        format!(
            "{}_{}",
            self.inbox,
            self.next_request.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Sends `payload` to `subject` and waits for the answer, at most `within`.
    pub(crate) async fn request(
        &self,
        subject: &str,
        payload: &[u8],
        within: Duration,
    ) -> Result<Msg, NatsError> {
        let token = self.next_request.fetch_add(1, Ordering::Relaxed);
        let reply = Bytes::from(format!("{}.{token}", self.inbox));
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(reply.clone(), tx);
        if !self.publish(subject.as_bytes(), Some(&reply), payload) {
            lock(&self.pending).remove(&reply);
            return Err(NatsError::Unreachable(
                "the connection is closed".to_owned(),
            ));
        }
        let answer = tokio::select! {
            answer = rx => answer.map_err(|_| NatsError::Unreachable("the connection closed".to_owned())),
            _ = tokio::time::sleep(within) => Err(NatsError::Unreachable(format!(
                "no answer to {subject} within {} ms",
                within.as_millis()
            ))),
        };
        lock(&self.pending).remove(&reply);
        let answer = answer?;
        // No responders (the JetStream API is not there: JetStream off, a wrong domain).
        if status(&answer).is_some_and(|(code, _)| code == 503) {
            return Err(NatsError::Refused(format!(
                "no responders for {subject}: is JetStream enabled on the server?"
            )));
        }
        Ok(answer)
    }
}

/// The status of a message without a record (`NATS/1.0 408 Request Timeout`): its code and
/// description.
pub(crate) fn status(msg: &Msg) -> Option<(u16, String)> {
    let headers = msg.headers.as_ref()?;
    let first = headers.split(|b| *b == b'\n').next()?;
    let first = first.strip_suffix(b"\r").unwrap_or(first);
    let rest = first.strip_prefix(b"NATS/1.0")?;
    let rest = String::from_utf8_lossy(rest);
    let rest = rest.trim();
    let (code, description) = rest.split_once(' ').unwrap_or((rest, ""));
    let code = code.parse().ok()?;
    Some((code, description.trim().to_owned()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Takes one control line (without its CRLF) off the front of `buf`, when a whole one is there.
fn take_line(buf: &mut BytesMut) -> Result<Option<Bytes>, NatsError> {
    match memchr(b'\n', buf) {
        Some(i) => {
            let mut line = buf.split_to(i + 1).freeze();
            line.truncate(i);
            if line.last() == Some(&b'\r') {
                line.truncate(i - 1);
            }
            Ok(Some(line))
        }
        None if buf.len() > MAX_CONTROL_LINE => Err(NatsError::Unreachable(
            "a control line from the server is longer than 1 MiB".to_owned(),
        )),
        None => Ok(None),
    }
}

fn memchr(byte: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == byte)
}

/// An operation the server sent.
#[derive(Debug, PartialEq, Eq)]
enum Op {
    Msg { sid: u64, msg: MsgFrame },
    Ping,
    Other,
    Err(String),
}

#[derive(Debug, PartialEq, Eq)]
struct MsgFrame {
    subject: Bytes,
    reply: Option<Bytes>,
    headers: Option<Bytes>,
    payload: Bytes,
}

/// The next whole operation at the front of `buf`, taken off it; `None` until one is whole.
fn parse(buf: &mut BytesMut) -> Result<Option<Op>, String> {
    let Some(eol) = memchr(b'\n', buf) else {
        if buf.len() > MAX_CONTROL_LINE {
            return Err("a control line from the server is longer than 1 MiB".to_owned());
        }
        return Ok(None);
    };
    let line_len = if eol > 0 && buf[eol - 1] == b'\r' {
        eol - 1
    } else {
        eol
    };
    let line = &buf[..line_len];
    let verb_end = line
        .iter()
        .position(|b| b.is_ascii_whitespace())
        .unwrap_or(line.len());
    let verb = line[..verb_end].to_ascii_uppercase();
    match verb.as_slice() {
        b"MSG" | b"HMSG" => {
            let with_headers = verb.as_slice() == b"HMSG";
            let args: Vec<Bytes> = split_args(&line[verb_end..]);
            // MSG <subject> <sid> [reply] <size>; HMSG <subject> <sid> [reply] <hdr> <total>
            let fixed = if with_headers { 4 } else { 3 };
            if args.len() != fixed && args.len() != fixed + 1 {
                return Err(format!(
                    "a {} line with {} arguments",
                    String::from_utf8_lossy(&verb),
                    args.len()
                ));
            }
            let number = |b: &Bytes| -> Result<usize, String> {
                std::str::from_utf8(b)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| format!("{:?} is not a size", String::from_utf8_lossy(b)))
            };
            let sid = number(&args[1])? as u64;
            let reply = (args.len() == fixed + 1).then(|| args[2].clone());
            let (header_len, total) = match with_headers {
                true => (
                    number(&args[args.len() - 2])?,
                    number(&args[args.len() - 1])?,
                ),
                false => (0, number(&args[args.len() - 1])?),
            };
            if header_len > total || total > MAX_MESSAGE {
                return Err(format!(
                    "a message of {total} bytes with {header_len} bytes of headers"
                ));
            }
            if buf.len() < eol + 1 + total + 2 {
                buf.reserve(eol + 1 + total + 2 - buf.len());
                return Ok(None);
            }
            let subject = args[0].clone();
            buf.advance(eol + 1);
            let mut body = buf.split_to(total).freeze();
            buf.advance(2);
            let headers = with_headers.then(|| body.split_to(header_len));
            Ok(Some(Op::Msg {
                sid,
                msg: MsgFrame {
                    subject,
                    reply,
                    headers,
                    payload: body,
                },
            }))
        }
        other => {
            let op = match other {
                b"PING" => Op::Ping,
                b"-ERR" => Op::Err(String::from_utf8_lossy(&line[verb_end..]).trim().to_owned()),
                _ => Op::Other, // PONG, +OK, INFO
            };
            buf.advance(eol + 1);
            Ok(Some(op))
        }
    }
}

/// The space- or tab-separated arguments of a control line, as bytes.
fn split_args(rest: &[u8]) -> Vec<Bytes> {
    rest.split(|b| *b == b' ' || *b == b'\t')
        .filter(|a| !a.is_empty())
        .map(Bytes::copy_from_slice)
        .collect()
}

async fn read_loop(
    mut reader: tokio::net::tcp::OwnedReadHalf,
    mut buf: BytesMut,
    out: mpsc::UnboundedSender<Out>,
    routes: Routes,
    pending: Pending,
    closed: CancellationToken,
) {
    let why = 'read: loop {
        loop {
            match parse(&mut buf) {
                Ok(None) => break,
                Ok(Some(Op::Msg { sid, msg })) => {
                    let msg = Msg {
                        subject: msg.subject,
                        reply: msg.reply,
                        headers: msg.headers,
                        payload: msg.payload,
                    };
                    if sid == REQUEST_SID {
                        if let Some(tx) = lock(&pending).remove(&msg.subject) {
                            let _ = tx.send(msg);
                        }
                    } else if let Some(tx) = lock(&routes).get(&sid) {
                        let _ = tx.send(msg);
                    }
                }
                Ok(Some(Op::Ping)) => {
                    let _ = out.send(Out::Bytes(Bytes::from_static(b"PONG\r\n")));
                }
                Ok(Some(Op::Err(e))) => {
                    // The server closes the connection after most errors; a permission
                    // violation on one subject it does not.
                    tracing::warn!("nats-server: -ERR {e}");
                }
                Ok(Some(Op::Other)) => {}
                Err(e) => break 'read format!("protocol error: {e}"),
            }
        }
        tokio::select! {
            _ = closed.cancelled() => break 'read String::new(),
            read = reader.read_buf(&mut buf) => match read {
                Ok(0) => break 'read "the server closed the connection".to_owned(),
                Ok(_) => {}
                Err(e) => break 'read format!("{e}"),
            },
        }
    };
    if !why.is_empty() {
        tracing::info!("nats connection lost: {why}");
    }
    closed.cancel();
    lock(&routes).clear();
    lock(&pending).clear();
}

async fn write_loop(
    mut writer: BufWriter<tokio::net::tcp::OwnedWriteHalf>,
    mut queue: mpsc::UnboundedReceiver<Out>,
    closed: CancellationToken,
) {
    let mut told = Vec::new();
    'write: loop {
        let first = tokio::select! {
            _ = closed.cancelled() => break,
            next = queue.recv() => next,
        };
        let Some(mut out) = first else { break };
        // Everything queued meanwhile goes in the same flush.
        loop {
            match out {
                Out::Bytes(b) => {
                    if writer.write_all(&b).await.is_err() {
                        break 'write;
                    }
                }
                Out::Flushed(tx) => told.push(tx),
            }
            match queue.try_recv() {
                Ok(more) => out = more,
                Err(_) => break,
            }
        }
        if writer.flush().await.is_err() {
            break;
        }
        for tx in told.drain(..) {
            let _ = tx.send(());
        }
    }
    closed.cancel();
    let _ = writer.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Result<Vec<Op>, String> {
        let mut buf = BytesMut::from(bytes);
        let mut ops = Vec::new();
        while let Some(op) = parse(&mut buf)? {
            ops.push(op);
        }
        Ok(ops)
    }

    #[test]
    fn messages_keep_every_byte_of_their_subject_reply_headers_and_payload() {
        let ops = parse_all(
            b"PING\r\nMSG a.b 7 5\r\nhe\r\no\r\nHMSG s\xff 9 $JS.ACK.x 13 15\r\nNATS/1.0\r\n\xfe\r\nok\r\n+OK\r\n",
        )
        .unwrap();
        assert_eq!(ops.len(), 4);
        assert_eq!(ops[0], Op::Ping);
        assert_eq!(
            ops[1],
            Op::Msg {
                sid: 7,
                msg: MsgFrame {
                    subject: Bytes::from_static(b"a.b"),
                    reply: None,
                    headers: None,
                    payload: Bytes::from_static(b"he\r\no"),
                }
            }
        );
        assert_eq!(
            ops[2],
            Op::Msg {
                sid: 9,
                msg: MsgFrame {
                    subject: Bytes::from_static(b"s\xff"),
                    reply: Some(Bytes::from_static(b"$JS.ACK.x")),
                    headers: Some(Bytes::from_static(b"NATS/1.0\r\n\xfe\r\n")),
                    payload: Bytes::from_static(b"ok"),
                }
            }
        );
        assert_eq!(ops[3], Op::Other);
    }

    #[test]
    fn a_message_is_taken_only_once_it_is_whole() {
        let whole = b"HMSG s 1 12 14\r\nNATS/1.0\r\n\r\nhi\r\n";
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(parse(&mut buf).unwrap(), None, "cut at {cut}");
            assert_eq!(buf.len(), cut);
        }
        assert!(parse_all(whole).unwrap().len() == 1);
    }

    #[test]
    fn malformed_frames_are_protocol_errors_not_panics() {
        assert!(parse_all(b"MSG a x 3\r\nabc\r\n").is_err());
        assert!(parse_all(b"MSG a\r\n").is_err());
        assert!(parse_all(b"HMSG a 1 20 10\r\n").is_err());
        assert!(parse_all(b"MSG a 1 99999999999999999999\r\n").is_err());
        assert!(parse(&mut BytesMut::from(&vec![b'x'; MAX_CONTROL_LINE + 1][..])).is_err());
    }
}

//! The frames a RabbitMQ delivery arrives in, checked before the client reads them, so that a
//! publisher's bytes can never stop a queue.
//!
//! AMQP's short strings (a property such as `message_id`, a header's name, a routing key) are
//! bytes on the wire, and RabbitMQ passes any bytes on. The client (lapin) reads them as UTF-8
//! text: a frame with other bytes, or a header of an unknown type, fails to parse, and the client
//! closes the connection. The delivery then goes back to the queue unacknowledged, comes again
//! at the head of the queue on the next connection, and closes that one too: the queue stops for
//! good, and every other queue on the connection with it.
//!
//! [`FrameGuard`] sits between the socket (after TLS) and the client and passes every frame on
//! unchanged, except two:
//! - a content header (class basic) whose properties the client cannot read, or whose headers
//!   carry [`RAW_PROPERTIES`], is passed on with one header instead: [`RAW_PROPERTIES`], a byte
//!   array holding the original property list (flags included); module `delivery` reads the
//!   record's key, timestamp and headers from those bytes, exactly;
//! - a `basic.deliver` whose exchange or routing key is not UTF-8 is passed on with that field
//!   empty (neither is part of the record).
//!
//! The guard never holds more than the frame being read; a frame larger than [`MAX_GUARDED`]
//! (which the client refuses anyway: it exceeds any frame size RabbitMQ allows) ends the
//! guarding and passes the rest through.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_rs::traits::Reactor;
use async_rs::util::RuntimeParts;
use async_rs::{Runtime, Tokio};
use futures::io::{AsyncRead, AsyncWrite};
use futures::{Future, Stream};
use lapin::protocol::basic::parse_properties;
use lapin::tcp::{AMQPUriTcpExt, AsyncTcpStream, OwnedTLSConfig};
use lapin::types::AMQPValue;
use lapin::uri::AMQPUri;

/// The header that carries a delivery's original properties when the client could not read them.
pub(crate) const RAW_PROPERTIES: &str = "x-batch-inbox-raw-properties";

/// The largest frame the guard reads whole (RabbitMQ's `frame_max` is at most 128 KiB by
/// default and 1 MiB at most in practice).
const MAX_GUARDED: usize = 64 << 20;

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_END: u8 = 0xCE;
const CLASS_CONNECTION: u16 = 10;
const CLASS_BASIC: u16 = 60;
const METHOD_TUNE: u16 = 30;
const METHOD_DELIVER: u16 = 60;
/// The `headers` bit of a basic property list's flags.
const FLAG_HEADERS: u16 = 1 << 13;

/// The byte stream of a connection with its deliveries' frames made readable (module docs).
pub(crate) struct FrameGuard<S> {
    inner: S,
    /// Bytes read from `inner` that do not make a whole frame yet.
    pending: Vec<u8>,
    /// Guarded bytes not yet read by the client, from `at`.
    ready: Vec<u8>,
    at: usize,
    scratch: Box<[u8]>,
    /// The frame size the client accepts (0: not negotiated yet; the lower of the broker's
    /// `connection.tune` and the URL's `frame_max`).
    frame_max: u32,
    /// The URL's `frame_max`, if any.
    client_frame_max: Option<u32>,
    /// A frame too large to guard was seen: everything passes through from then on.
    through: bool,
    eof: bool,
}

impl<S> FrameGuard<S> {
    pub(crate) fn new(inner: S, client_frame_max: Option<u32>) -> Self {
        Self {
            inner,
            pending: Vec::new(),
            ready: Vec::new(),
            at: 0,
            scratch: vec![0; 64 << 10].into_boxed_slice(),
            frame_max: 0,
            client_frame_max: client_frame_max.filter(|m| *m > 0),
            through: false,
            eof: false,
        }
    }

    /// Moves every whole frame of `pending` to `ready`, guarded.
    fn frames(&mut self) {
        let mut pos = 0;
        while pos < self.pending.len() {
            let rest = &self.pending[pos..];
            if self.through || rest.starts_with(b"AMQP") {
                // A protocol header (the broker refusing our version) or an unguarded stream.
                self.ready.extend_from_slice(rest);
                pos = self.pending.len();
                break;
            }
            if rest.len() < 7 {
                break;
            }
            let size = u32::from_be_bytes([rest[3], rest[4], rest[5], rest[6]]) as usize;
            if size > MAX_GUARDED {
                self.through = true;
                continue;
            }
            let total = 7 + size + 1;
            if rest.len() < total {
                break;
            }
            let frame = &rest[..total];
            guard(
                frame,
                &mut self.ready,
                &mut self.frame_max,
                self.client_frame_max,
            );
            pos += total;
        }
        self.pending.drain(..pos);
    }
}

/// Every whole frame of `stream`, guarded, with `frame_max` as the negotiated frame size.
pub(crate) fn guard_all(stream: &[u8], frame_max: u32) -> Vec<u8> {
    let mut guard = FrameGuard::new((), None);
    guard.frame_max = frame_max;
    guard.pending = stream.to_vec();
    guard.frames();
    guard.ready
}

/// Appends `frame` to `out`, guarded (module docs); records the broker's `frame_max`.
fn guard(frame: &[u8], out: &mut Vec<u8>, frame_max: &mut u32, client: Option<u32>) {
    let payload = &frame[7..frame.len() - 1];
    let head = |i: usize| {
        payload
            .get(i..i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    match (frame[0], head(0), head(2)) {
        (FRAME_METHOD, Some(CLASS_CONNECTION), Some(METHOD_TUNE)) => {
            if let Some(b) = payload.get(6..10) {
                let server = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                *frame_max = match (server, client) {
                    (0, Some(c)) => c,
                    (s, Some(c)) if c < s => c,
                    (s, _) => s,
                };
            }
            out.extend_from_slice(frame);
        }
        (FRAME_METHOD, Some(CLASS_BASIC), Some(METHOD_DELIVER)) => match deliver(payload) {
            Some(payload) => push_frame(out, frame, &payload),
            None => out.extend_from_slice(frame),
        },
        (FRAME_HEADER, Some(CLASS_BASIC), _) => {
            // A header larger than the client accepts (the broker checks only what it
            // receives, and adds headers of its own: x-death, x-delivery-count) would make the
            // client drop the connection: it becomes an empty carrier, a header error.
            let too_large = *frame_max != 0 && frame.len() > *frame_max as usize;
            let guarded = match too_large {
                true => Some(carrier(&payload[..12.min(payload.len())], &[])),
                false => content_header(payload, *frame_max),
            };
            match guarded {
                Some(payload) => push_frame(out, frame, &payload),
                None => out.extend_from_slice(frame),
            }
        }
        _ => out.extend_from_slice(frame),
    }
}

/// `frame` with `payload` instead of its own.
fn push_frame(out: &mut Vec<u8>, frame: &[u8], payload: &[u8]) {
    out.extend_from_slice(&frame[..3]);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(FRAME_END);
}

/// A short string at `pos`: its bytes and the position after it.
fn short_string(b: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let len = usize::from(*b.get(pos)?);
    let s = b.get(pos + 1..pos + 1 + len)?;
    Some((s, pos + 1 + len))
}

/// A `basic.deliver` payload with its exchange and routing key emptied when either is not
/// UTF-8; `None` when it is readable as it is (or too short to be one: the client says so).
fn deliver(payload: &[u8]) -> Option<Vec<u8>> {
    let (_tag, pos) = short_string(payload, 4)?;
    let after_tag = pos;
    // delivery-tag (8) and redelivered (1)
    let (exchange, pos) = short_string(payload, after_tag + 9)?;
    let (routing_key, end) = short_string(payload, pos)?;
    if std::str::from_utf8(exchange).is_ok() && std::str::from_utf8(routing_key).is_ok() {
        return None;
    }
    let mut out = Vec::with_capacity(payload.len());
    out.extend_from_slice(&payload[..after_tag + 9]);
    for field in [exchange, routing_key] {
        match std::str::from_utf8(field) {
            Ok(_) => {
                out.push(field.len() as u8);
                out.extend_from_slice(field);
            }
            Err(_) => out.push(0),
        }
    }
    out.extend_from_slice(&payload[end..]);
    Some(out)
}

/// A basic content header's payload with its properties replaced by [`RAW_PROPERTIES`] when the
/// client cannot read them (or they already carry that header); `None` when they pass as they
/// are. `frame_max`: the largest frame the client accepts (0: no limit known); properties too
/// large to carry whole within it are replaced by an empty [`RAW_PROPERTIES`].
fn content_header(payload: &[u8], frame_max: u32) -> Option<Vec<u8>> {
    // class (2), weight (2), body size (8), then the property list.
    let properties = payload.get(12..)?;
    // Our own reading first: it bounds the nesting of the headers (the client's parser recurses
    // without a limit), then the client's own parser has the last word.
    if read(properties, false).is_ok_and(|p| p.clean) {
        if let Ok((rest, parsed)) = parse_properties(properties) {
            let marked = parsed
                .headers()
                .as_ref()
                .is_some_and(|h| h.contains_key(RAW_PROPERTIES));
            if rest.is_empty() && !marked {
                return None;
            }
        }
    }
    let key = RAW_PROPERTIES.as_bytes();
    // flags (2), table length (4), key, type (1), byte array length (4), the bytes
    let overhead = 12 + 2 + 4 + 1 + key.len() + 1 + 4;
    // frame type, channel and size (7), the payload, the frame end (1)
    let frame_len = 7 + overhead + properties.len() + 1;
    let carried = match frame_max {
        0 => properties,
        max if frame_len <= max as usize => properties,
        _ => &[],
    };
    Some(carrier(&payload[..12], carried))
}

/// A content header payload: `head` (class, weight, body size) and one header,
/// [`RAW_PROPERTIES`], holding `carried`.
fn carrier(head: &[u8], carried: &[u8]) -> Vec<u8> {
    let key = RAW_PROPERTIES.as_bytes();
    let table_len = 1 + key.len() + 1 + 4 + carried.len();
    let mut out = Vec::with_capacity(head.len() + 2 + 4 + table_len);
    out.extend_from_slice(head);
    out.extend_from_slice(&FLAG_HEADERS.to_be_bytes());
    out.extend_from_slice(&(table_len as u32).to_be_bytes());
    out.push(key.len() as u8);
    out.extend_from_slice(key);
    out.push(b'x');
    out.extend_from_slice(&(carried.len() as u32).to_be_bytes());
    out.extend_from_slice(carried);
    out
}

/// A property list read from its bytes (the slow path of module `delivery`, and the guard's
/// check): every field as bytes, exactly.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Properties {
    pub(crate) message_id: Option<Vec<u8>>,
    pub(crate) timestamp: Option<u64>,
    /// The headers table's entries in wire order, names as bytes (nested tables' names as text,
    /// bytes that are not UTF-8 replaced).
    pub(crate) headers: Vec<(Vec<u8>, AMQPValue)>,
    /// Why the headers table could not be read (its entries are then dropped).
    pub(crate) header_error: Option<String>,
    /// Every short string is UTF-8 and nothing is malformed: the client reads it as it is.
    pub(crate) clean: bool,
}

/// How deep headers may nest (tables in tables, arrays in arrays).
const MAX_DEPTH: usize = 32;

/// Reads a basic property list (flags first). `build`: keep the values (else only check them).
/// `Err`: the list itself is cut short or has trailing bytes (a header table's fault is
/// `header_error`, the fields after it still read).
pub(crate) fn read(bytes: &[u8], build: bool) -> Result<Properties, String> {
    let mut c = Cursor { b: bytes, pos: 0 };
    let mut p = Properties {
        clean: true,
        ..Properties::default()
    };
    let flags = c.u16()?;
    if flags & 1 != 0 {
        return Err("the property flags continue past 16 bits, which basic does not define".into());
    }
    for bit in (2..=15).rev() {
        if flags & (1 << bit) == 0 {
            continue;
        }
        match bit {
            13 => {
                let len = c.u32()? as usize;
                let table = c.take(len)?;
                let mut t = Cursor { b: table, pos: 0 };
                match t.table_entries(0, build, &mut p.clean) {
                    Ok(entries) => p.headers = entries,
                    Err(e) => {
                        p.clean = false;
                        p.header_error = Some(format!("the headers table cannot be read: {e}"));
                    }
                }
            }
            12 | 11 => {
                c.take(1)?;
            }
            6 => p.timestamp = Some(c.u64()?),
            _ => {
                let s = c.short_string()?;
                p.clean &= std::str::from_utf8(s).is_ok();
                if bit == 7 {
                    p.message_id = Some(s.to_vec());
                }
            }
        }
    }
    if c.pos != bytes.len() {
        return Err(format!(
            "{} bytes after the last property",
            bytes.len() - c.pos
        ));
    }
    Ok(p)
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.b.len());
        let Some(end) = end else {
            return Err(format!(
                "{n} bytes wanted at byte {}, {} left",
                self.pos,
                self.b.len() - self.pos
            ));
        };
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let s = self.take(N)?;
        let mut a = [0; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u16(&mut self) -> Result<u16, String> {
        self.array().map(u16::from_be_bytes)
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_be_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_be_bytes)
    }

    fn short_string(&mut self) -> Result<&'a [u8], String> {
        let len = self.take(1)?[0];
        self.take(usize::from(len))
    }

    /// The entries of a table whose bytes are this cursor's.
    fn table_entries(
        &mut self,
        depth: usize,
        build: bool,
        clean: &mut bool,
    ) -> Result<Vec<(Vec<u8>, AMQPValue)>, String> {
        let mut entries = Vec::new();
        while self.pos < self.b.len() {
            let name = self.short_string()?;
            *clean &= std::str::from_utf8(name).is_ok();
            let value = self.value(depth, build, clean)?;
            if build {
                entries.push((name.to_vec(), value));
            }
        }
        Ok(entries)
    }

    /// A typed value (`Void` when not `build`ing).
    fn value(&mut self, depth: usize, build: bool, clean: &mut bool) -> Result<AMQPValue, String> {
        use AMQPValue as V;
        let kind = self.take(1)?[0];
        let v = match kind {
            b't' => V::Boolean(self.take(1)?[0] != 0),
            b'b' => V::ShortShortInt(i8::from_be_bytes(self.array()?)),
            b'B' => V::ShortShortUInt(self.take(1)?[0]),
            b's' | b'U' => V::ShortInt(i16::from_be_bytes(self.array()?)),
            b'u' => V::ShortUInt(self.u16()?),
            b'I' => V::LongInt(i32::from_be_bytes(self.array()?)),
            b'i' => V::LongUInt(self.u32()?),
            b'L' | b'l' => V::LongLongInt(i64::from_be_bytes(self.array()?)),
            b'f' => V::Float(f32::from_be_bytes(self.array()?)),
            b'd' => V::Double(f64::from_be_bytes(self.array()?)),
            b'D' => {
                let scale = self.take(1)?[0];
                let value = self.u32()?;
                V::DecimalValue(lapin::types::DecimalValue { scale, value })
            }
            b'T' => V::Timestamp(self.u64()?),
            b'V' => V::Void,
            b'S' | b'x' => {
                let len = self.u32()? as usize;
                let bytes = self.take(len)?;
                match (build, kind) {
                    (false, _) => V::Void,
                    (true, b'S') => V::LongString(bytes.to_vec().into()),
                    (true, _) => V::ByteArray(bytes.to_vec().into()),
                }
            }
            b'F' | b'A' => {
                if depth >= MAX_DEPTH {
                    return Err(format!("headers nested deeper than {MAX_DEPTH}"));
                }
                let len = self.u32()? as usize;
                let mut inner = Cursor {
                    b: self.take(len)?,
                    pos: 0,
                };
                if kind == b'F' {
                    let entries = inner.table_entries(depth + 1, build, clean)?;
                    let mut table = lapin::types::FieldTable::default();
                    for (name, value) in entries {
                        let name = String::from_utf8_lossy(&name).into_owned();
                        table.insert(name.into(), value);
                    }
                    V::FieldTable(table)
                } else {
                    let mut array = lapin::types::FieldArray::default();
                    while inner.pos < inner.b.len() {
                        array.push(inner.value(depth + 1, build, clean)?);
                    }
                    V::FieldArray(array)
                }
            }
            other => {
                return Err(format!(
                    "a header value of type {:?}, which AMQP does not define",
                    char::from(other)
                ))
            }
        };
        Ok(if build { v } else { V::Void })
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FrameGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            if this.at < this.ready.len() {
                let n = buf.len().min(this.ready.len() - this.at);
                buf[..n].copy_from_slice(&this.ready[this.at..this.at + n]);
                this.at += n;
                if this.at == this.ready.len() {
                    this.ready.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(n));
            }
            if this.eof || buf.is_empty() {
                return Poll::Ready(Ok(0));
            }
            match Pin::new(&mut this.inner).poll_read(cx, &mut this.scratch) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => {
                    // The end: an incomplete frame goes to the client as it is.
                    this.eof = true;
                    this.ready.append(&mut this.pending);
                }
                Poll::Ready(Ok(n)) => {
                    this.pending.extend_from_slice(&this.scratch[..n]);
                    this.frames();
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FrameGuard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}

/// The socket under the guard: TCP, or TLS over TCP, on tokio.
type Socket = AsyncTcpStream<<Tokio as Reactor>::TcpStream>;

/// The client's reactor: tokio's, whose streams are guarded sockets.
#[derive(Clone, Debug)]
pub(crate) struct GuardedReactor(Tokio);

impl Reactor for GuardedReactor {
    type TcpStream = FrameGuard<Socket>;
    type Sleep = <Tokio as Reactor>::Sleep;

    /// Not used by the client (it connects through [`connect`]).
    fn register<H: Read + Write + Send + 'static>(
        &self,
        _socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static> {
        Err::<futures::io::Cursor<Vec<u8>>, _>(io::Error::other(
            "a raw handle cannot be guarded: connect through the guard",
        ))
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.0.sleep(dur)
    }

    fn interval(&self, dur: Duration) -> impl Stream<Item = Instant> + Send + 'static {
        self.0.interval(dur)
    }

    fn tcp_connect_addr(
        &self,
        addr: SocketAddr,
    ) -> impl Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        let connect = self.0.tcp_connect_addr(addr);
        async move { Ok(FrameGuard::new(AsyncTcpStream::Plain(connect.await?), None)) }
    }
}

/// The client's runtime: tokio's executor, the guarded reactor.
pub(crate) type GuardedRuntime = Runtime<RuntimeParts<Tokio, GuardedReactor>>;

/// Connects to `uri` (TLS for `amqps://`) with every frame the broker sends guarded.
pub(crate) async fn connect(
    uri: AMQPUri,
    properties: lapin::ConnectionProperties,
) -> lapin::Result<lapin::Connection> {
    let runtime: GuardedRuntime = Runtime::new(RuntimeParts::new(
        Tokio::current(),
        GuardedReactor(Tokio::current()),
    ));
    lapin::Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, _runtime| {
            let tokio = Runtime::new(Tokio::current());
            let tls = OwnedTLSConfig::default();
            let socket = uri
                .connect_with_config_async(tls.as_ref(), &tokio)
                .await
                .map_err(lapin::Error::from)?;
            let guarded = FrameGuard::new(socket, uri.query.frame_max);
            Ok(AsyncTcpStream::Plain(guarded))
        },
        properties,
    )
    .await
}

#[cfg(test)]
mod tests;

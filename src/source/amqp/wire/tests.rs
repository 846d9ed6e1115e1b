use super::*;
use futures::io::AsyncReadExt;
use lapin::protocol::basic::{parse_deliver, parse_properties};

/// A frame of `kind` on channel 1 holding `payload`.
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind, 0, 1];
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f.push(FRAME_END);
    f
}

fn short(out: &mut Vec<u8>, s: &[u8]) {
    out.push(s.len() as u8);
    out.extend_from_slice(s);
}

/// A property list: `message_id`, `timestamp`, and a headers table of raw entries.
fn properties(message_id: &[u8], timestamp: Option<u64>, table: Option<&[u8]>) -> Vec<u8> {
    let mut flags = 1u16 << 7;
    flags |= timestamp.map_or(0, |_| 1 << 6);
    flags |= table.map_or(0, |_| FLAG_HEADERS);
    let mut p = flags.to_be_bytes().to_vec();
    if let Some(t) = table {
        p.extend_from_slice(&(t.len() as u32).to_be_bytes());
        p.extend_from_slice(t);
    }
    short(&mut p, message_id);
    if let Some(ts) = timestamp {
        p.extend_from_slice(&ts.to_be_bytes());
    }
    p
}

/// A content header payload (class basic, body of 5 bytes) with `props`.
fn header(props: &[u8]) -> Vec<u8> {
    let mut h = vec![0, 60, 0, 0];
    h.extend_from_slice(&5u64.to_be_bytes());
    h.extend_from_slice(props);
    h
}

/// A table entry: `name` = long string `value`.
fn long_entry(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut e = Vec::new();
    short(&mut e, name);
    e.push(b'S');
    e.extend_from_slice(&(value.len() as u32).to_be_bytes());
    e.extend_from_slice(value);
    e
}

/// `bytes` through a guard that reads them `chunk` bytes at a time.
fn through(bytes: &[u8], chunk: usize, frame_max: u32) -> Vec<u8> {
    struct Trickle(Vec<u8>, usize, usize);
    impl AsyncRead for Trickle {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            let n = this.2.min(buf.len()).min(this.0.len() - this.1);
            buf[..n].copy_from_slice(&this.0[this.1..this.1 + n]);
            this.1 += n;
            Poll::Ready(Ok(n))
        }
    }
    let mut guard = FrameGuard::new(Trickle(bytes.to_vec(), 0, chunk), None);
    guard.frame_max = frame_max;
    let mut out = Vec::new();
    futures::executor::block_on(guard.read_to_end(&mut out)).unwrap();
    out
}

/// The payload of the single frame `bytes` holds.
fn payload_of(bytes: &[u8]) -> &[u8] {
    let size = u32::from_be_bytes([bytes[3], bytes[4], bytes[5], bytes[6]]) as usize;
    assert_eq!(bytes.len(), size + 8, "one whole frame");
    assert_eq!(bytes[bytes.len() - 1], FRAME_END);
    &bytes[7..7 + size]
}

#[test]
fn readable_frames_pass_byte_for_byte_whatever_the_reads() {
    let mut stream = Vec::new();
    let table = long_entry(b"id", b"\xff\x00 any bytes in a long string");
    stream.extend(frame(
        FRAME_HEADER,
        &header(&properties(b"m-1", Some(7), Some(&table))),
    ));
    stream.extend(frame(3, b"hello"));
    stream.extend(frame(8, &[]));
    for chunk in [1, 2, 7, 13, 1 << 16] {
        assert_eq!(through(&stream, chunk, 0), stream, "reads of {chunk} bytes");
    }
}

#[test]
fn a_message_id_and_a_header_name_that_are_not_utf8_are_carried_exactly() {
    let mut table = long_entry(b"name-\xc3\x28", b"v");
    table.extend(long_entry(b"ok", b"w"));
    let original = properties(b"\xff\xfe id", Some(1_700_000_000), Some(&table));
    assert!(
        parse_properties(&original[..]).is_err(),
        "the client cannot read these properties"
    );
    let out = through(&frame(FRAME_HEADER, &header(&original)), 3, 131_072);
    let payload = payload_of(&out);
    assert_eq!(
        &payload[..12],
        &header(&[])[..12],
        "class, weight and body size kept"
    );
    let (rest, parsed) = parse_properties(&payload[12..]).expect("the client reads them now");
    assert!(rest.is_empty());
    let headers = parsed.headers().clone().unwrap();
    assert_eq!(headers.inner().len(), 1);
    match headers.inner().get(RAW_PROPERTIES) {
        Some(AMQPValue::ByteArray(b)) => assert_eq!(b.as_slice(), &original[..]),
        other => panic!("{other:?}"),
    }
    let read = read(&original, true).unwrap();
    assert!(!read.clean);
    assert_eq!(read.message_id.as_deref(), Some(&b"\xff\xfe id"[..]));
    assert_eq!(read.timestamp, Some(1_700_000_000));
    assert_eq!(read.header_error, None);
    let names: Vec<&[u8]> = read.headers.iter().map(|(n, _)| n.as_slice()).collect();
    assert_eq!(names, vec![&b"name-\xc3\x28"[..], &b"ok"[..]]);
}

#[test]
fn a_publisher_s_own_raw_properties_header_is_carried_not_trusted() {
    let table = long_entry(RAW_PROPERTIES.as_bytes(), b"forged");
    let original = properties(b"m-2", None, Some(&table));
    assert!(parse_properties(&original[..]).is_ok());
    let out = through(&frame(FRAME_HEADER, &header(&original)), 1 << 16, 0);
    let (_, parsed) = parse_properties(&payload_of(&out)[12..]).unwrap();
    match parsed
        .headers()
        .clone()
        .unwrap()
        .inner()
        .get(RAW_PROPERTIES)
    {
        Some(AMQPValue::ByteArray(b)) => assert_eq!(b.as_slice(), &original[..]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_unknown_header_type_loses_the_headers_not_the_id() {
    let mut table = Vec::new();
    short(&mut table, b"odd");
    table.extend_from_slice(b"Z\x00\x01");
    let original = properties(b"m-3", Some(5), Some(&table));
    assert!(parse_properties(&original[..]).is_err());
    let out = through(&frame(FRAME_HEADER, &header(&original)), 5, 0);
    assert!(parse_properties(&payload_of(&out)[12..]).is_ok());
    let read = read(&original, true).unwrap();
    assert_eq!(read.message_id.as_deref(), Some(&b"m-3"[..]));
    assert_eq!(read.timestamp, Some(5));
    assert!(read.headers.is_empty());
    let error = read.header_error.unwrap();
    assert!(error.contains("'Z'"), "{error}");
}

#[test]
fn headers_nested_past_the_limit_are_carried_without_recursing_into_them() {
    // Tables in tables, far past the limit: neither the guard nor the client recurses into them.
    let mut value = Vec::new();
    for _ in 0..5_000 {
        let mut outer = Vec::new();
        short(&mut outer, b"n");
        outer.push(b'F');
        outer.extend_from_slice(&(value.len() as u32).to_be_bytes());
        outer.extend_from_slice(&value);
        value = outer;
    }
    let original = properties(b"m-4", None, Some(&value));
    let out = through(&frame(FRAME_HEADER, &header(&original)), 1 << 16, 0);
    assert!(parse_properties(&payload_of(&out)[12..]).is_ok());
    let read = read(&original, true).unwrap();
    assert_eq!(read.message_id.as_deref(), Some(&b"m-4"[..]));
    assert!(read.header_error.unwrap().contains("nested deeper"));
}

#[test]
fn properties_too_large_for_a_frame_are_replaced_by_an_empty_carrier() {
    let original = properties(b"\xff", None, None);
    let out = through(&frame(FRAME_HEADER, &header(&original)), 1 << 16, 40);
    let (_, parsed) = parse_properties(&payload_of(&out)[12..]).unwrap();
    match parsed
        .headers()
        .clone()
        .unwrap()
        .inner()
        .get(RAW_PROPERTIES)
    {
        Some(AMQPValue::ByteArray(b)) => assert!(b.as_slice().is_empty()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_routing_key_that_is_not_utf8_is_emptied_and_the_rest_kept() {
    let mut deliver = vec![0, 60, 0, 60];
    short(&mut deliver, b"ctag-1");
    deliver.extend_from_slice(&42u64.to_be_bytes());
    deliver.push(1);
    short(&mut deliver, b"ex");
    short(&mut deliver, b"key-\xff");
    assert!(parse_deliver(&deliver[4..]).is_err());
    let out = through(&frame(FRAME_METHOD, &deliver), 4, 0);
    let (rest, d) = parse_deliver(&payload_of(&out)[4..]).expect("readable now");
    assert!(rest.is_empty());
    assert_eq!(d.consumer_tag.as_str(), "ctag-1");
    assert_eq!(d.delivery_tag, 42);
    assert!(d.redelivered);
    assert_eq!(d.exchange.as_str(), "ex");
    assert_eq!(d.routing_key.as_str(), "");
}

#[test]
fn the_broker_s_frame_max_is_learnt_from_its_tune() {
    let mut tune = vec![0, 10, 0, 30, 0x07, 0xff];
    tune.extend_from_slice(&4096u32.to_be_bytes());
    tune.extend_from_slice(&[0, 60]);
    let mut guard = FrameGuard::new(futures::io::Cursor::new(Vec::<u8>::new()), Some(8192));
    guard.pending = frame(FRAME_METHOD, &tune);
    guard.frames();
    assert_eq!(guard.frame_max, 4096);
    let mut guard = FrameGuard::new(futures::io::Cursor::new(Vec::<u8>::new()), Some(1024));
    guard.pending = frame(FRAME_METHOD, &tune);
    guard.frames();
    assert_eq!(guard.frame_max, 1024, "the URL's lower frame_max");
}

#[test]
fn a_cut_stream_passes_its_incomplete_tail_to_the_client() {
    let whole = frame(FRAME_HEADER, &header(&properties(b"\xff", None, None)));
    let cut = &whole[..whole.len() - 3];
    assert_eq!(through(cut, 2, 0), cut);
}

#[test]
fn trailing_or_missing_property_bytes_are_errors() {
    let mut p = properties(b"m", None, None);
    p.push(0);
    assert!(read(&p, true)
        .unwrap_err()
        .contains("after the last property"));
    let p = properties(b"m", Some(1), None);
    assert!(read(&p[..p.len() - 2], true).is_err());
}

#[test]
fn a_readable_header_larger_than_the_client_accepts_becomes_an_empty_carrier() {
    // The broker added headers (x-death, x-delivery-count) past the negotiated frame_max: the
    // client would drop the connection on the frame as it is.
    let table = long_entry(b"x-death", &[b'x'; 200]);
    let original = properties(b"m-5", None, Some(&table));
    assert!(parse_properties(&original[..]).is_ok());
    let whole = frame(FRAME_HEADER, &header(&original));
    let out = through(&whole, 1 << 16, (whole.len() - 1) as u32);
    assert!(out.len() < whole.len());
    let payload = payload_of(&out);
    assert_eq!(&payload[..12], &header(&[])[..12]);
    let (_, parsed) = parse_properties(&payload[12..]).unwrap();
    match parsed
        .headers()
        .clone()
        .unwrap()
        .inner()
        .get(RAW_PROPERTIES)
    {
        Some(AMQPValue::ByteArray(b)) => assert!(b.as_slice().is_empty()),
        other => panic!("{other:?}"),
    }
    // At the limit exactly, it passes as it is.
    assert_eq!(through(&whole, 1 << 16, whole.len() as u32), whole);
}

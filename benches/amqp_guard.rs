//! CPU cost of the RabbitMQ frame guard (`source/amqp/wire.rs`): every frame the broker sends
//! passes through it before the client reads it, and a delivery's content header is read twice
//! there (a bounded reader of our own, then the client's own parser).
//!
//! Why: the guard is on the path of every delivery; its cost per delivery must stay small next
//! to the processor's CPU per record (results/rabbitmq/: about 18 µs of the two cores per record
//! at 54,870 records/s). Input: 1000 deliveries as RabbitMQ sends them (basic.deliver, content
//! header with message_id, timestamp and a small headers table, a 40-byte body), readable ones
//! (passed through) and ones whose message_id is not UTF-8 (carried whole). No I/O.

use std::hint::black_box;

use batch_inbox::internals::amqp::guard_frames;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const DELIVERIES: u64 = 1_000;

fn frame(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(0xCE);
}

fn short(out: &mut Vec<u8>, s: &[u8]) {
    out.push(s.len() as u8);
    out.extend_from_slice(s);
}

/// `DELIVERIES` deliveries; `hostile`: message ids that are not UTF-8.
fn stream(hostile: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for tag in 1..=DELIVERIES {
        let mut deliver = vec![0, 60, 0, 60];
        short(&mut deliver, b"amq.ctag-0123456789abcdef");
        deliver.extend_from_slice(&tag.to_be_bytes());
        deliver.push(0);
        short(&mut deliver, b"");
        short(&mut deliver, b"ledger-0");
        frame(&mut out, 1, &deliver);

        let body = br#"{"account_id":42,"amount":-1250}   "#;
        let mut header = vec![0, 60, 0, 0];
        header.extend_from_slice(&(body.len() as u64).to_be_bytes());
        let flags: u16 = (1 << 13) | (1 << 12) | (1 << 7) | (1 << 6);
        header.extend_from_slice(&flags.to_be_bytes());
        let mut table = Vec::new();
        short(&mut table, b"source");
        table.push(b'S');
        table.extend_from_slice(&7u32.to_be_bytes());
        table.extend_from_slice(b"billing");
        short(&mut table, b"attempt");
        table.push(b'I');
        table.extend_from_slice(&1i32.to_be_bytes());
        header.extend_from_slice(&(table.len() as u32).to_be_bytes());
        header.extend_from_slice(&table);
        header.push(2); // delivery mode: persistent
        let id = format!("0b9e4c1a-6f1d-4c8e-9a57-{tag:012x}");
        let mut id = id.into_bytes();
        if hostile {
            id[0] = 0xff;
        }
        short(&mut header, &id);
        header.extend_from_slice(&1_700_000_000u64.to_be_bytes());
        frame(&mut out, 2, &header);
        frame(&mut out, 3, body);
    }
    out
}

fn guard(c: &mut Criterion) {
    let mut group = c.benchmark_group("amqp_frame_guard");
    group.throughput(Throughput::Elements(DELIVERIES));
    for (name, hostile) in [("readable", false), ("message_id_not_utf8", true)] {
        let input = stream(hostile);
        let out = guard_frames(&input);
        assert_eq!(
            out.len() > input.len(),
            hostile,
            "carried only when hostile"
        );
        group.bench_with_input(BenchmarkId::from_parameter(name), &input, |b, input| {
            b.iter(|| black_box(guard_frames(black_box(input))))
        });
    }
    group.finish();
}

criterion_group!(benches, guard);
criterion_main!(benches);

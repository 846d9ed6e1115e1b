//! CPU cost of turning a 1000-record batch into handler input: `decode_batch::<Entry>` (id header
//! to UUID, JSON value to `Entry`, bad records to dead letters) and `dedup_in_batch` on the result.
//!
//! Why: this work runs once per batch before the transaction opens; it must stay small next to
//! the database time per batch. Input is the generator's own records (default mix: ~10%
//! duplicates, ~1% bad input) and a clean variant without either. No I/O.

use std::hint::black_box;
use std::sync::Arc;

use batch_inbox::internals::message::{decode_batch, dedup_in_batch};
use batch_inbox::ledger::Entry;
use batch_inbox::{Header, Message, RawMessage};
use batch_inbox_tools::generate::{Generator, GeneratorSettings, Record};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};

const BATCH: u64 = 1_000;
const ID_HEADER: &str = "id";

/// The record as the consumer would hand it over.
fn raw(topic: &Arc<str>, offset: i64, record: Record) -> RawMessage {
    RawMessage {
        topic: Arc::clone(topic),
        partition: 0,
        offset,
        timestamp_ms: None,
        key: Some(Bytes::from(record.key)),
        payload: record.value.map(Bytes::from),
        headers: record
            .id
            .map(|id| Header {
                key: Bytes::from_static(ID_HEADER.as_bytes()),
                value: Some(Bytes::from(id)),
            })
            .into_iter()
            .collect(),
        header_error: None,
    }
}

/// A batch of `BATCH` generated records; `mixed` keeps the default duplicates and bad input.
fn batch(mixed: bool) -> Vec<RawMessage> {
    let defaults = GeneratorSettings::default();
    let settings = GeneratorSettings {
        messages: BATCH,
        duplicate_ratio: if mixed { defaults.duplicate_ratio } else { 0.0 },
        bad_ratio: if mixed { defaults.bad_ratio } else { 0.0 },
        ..defaults
    };
    let topic: Arc<str> = Arc::from("ledger");
    Generator::new(settings)
        .enumerate()
        .map(|(i, r)| raw(&topic, i as i64, r))
        .collect()
}

fn decoded(input: &[RawMessage]) -> Vec<Message<Entry>> {
    decode_batch::<Entry>(input.to_vec(), ID_HEADER).messages
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_batch_1000");
    group.throughput(Throughput::Elements(BATCH));
    for (name, mixed) in [("clean", false), ("mixed", true)] {
        let input = batch(mixed);
        group.bench_with_input(BenchmarkId::from_parameter(name), &input, |b, input| {
            b.iter_batched(
                || input.clone(),
                |input| black_box(decode_batch::<Entry>(input, ID_HEADER)),
                BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

fn dedup(c: &mut Criterion) {
    let mut group = c.benchmark_group("dedup_in_batch_1000");
    for (name, mixed) in [("clean", false), ("mixed", true)] {
        // Bad records never reach dedup: count the decoded messages only.
        let messages = decoded(&batch(mixed));
        group.throughput(Throughput::Elements(messages.len() as u64));
        group.bench_with_input(
            BenchmarkId::from_parameter(name),
            &messages,
            |b, messages| {
                b.iter_batched(
                    || messages.clone(),
                    // Returned, so dropping the messages is not timed.
                    |mut messages| {
                        black_box(dedup_in_batch(&mut messages, |m| m.id));
                        messages
                    },
                    BatchSize::LargeInput,
                );
            },
        );
    }
    group.finish();
}

criterion_group!(benches, decode, dedup);
criterion_main!(benches);

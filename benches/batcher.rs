//! Throughput of the pure micro-batcher: push N items through `Batcher` and pop every closed
//! batch, as the per-partition loop does, for batch sizes 1, 100, 1000 and 5000.
//!
//! Why: the batcher sits on the hot path of every record. This shows its cost per item is
//! negligible next to the database round trip it saves, and that it does not degrade with the
//! batch size. No I/O; `tokio::time::Instant::now()` is read once per push, as the caller does
//! (outside a runtime it falls back to the std clock).

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::time::Duration;

use batch_inbox::BatcherSettings;

use batch_inbox::internals::batcher::Batcher;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokio::time::Instant;

/// Items pushed per iteration.
const ITEMS: usize = 50_000;
/// Bytes per item, as a small ledger record would count.
const ITEM_BYTES: usize = 120;
const BATCH_SIZES: [usize; 4] = [1, 100, 1_000, 5_000];

fn settings(max_items: usize) -> BatcherSettings {
    BatcherSettings::new(
        NonZeroUsize::new(max_items).expect("batch sizes are positive"),
        NonZeroUsize::new(64 << 20).expect("a positive byte limit"),
        Duration::from_secs(60),
    )
}

/// Pushes `items` items and drains every closed batch; returns the number of items popped.
fn run(max_items: usize, items: usize) -> usize {
    let mut batcher = Batcher::new(settings(max_items));
    let mut popped = 0;
    for i in 0..items {
        batcher.push(black_box(i as u64), ITEM_BYTES, Instant::now());
        while let Some(batch) = batcher.pop_ready() {
            popped += black_box(batch.items).len();
        }
    }
    batcher.flush();
    while let Some(batch) = batcher.pop_ready() {
        popped += batch.items.len();
    }
    popped
}

fn push_and_pop(c: &mut Criterion) {
    let mut group = c.benchmark_group("batcher_push_pop");
    group.throughput(Throughput::Elements(ITEMS as u64));
    for size in BATCH_SIZES {
        assert_eq!(run(size, ITEMS), ITEMS, "every item must leave the batcher");
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| run(size, ITEMS));
        });
    }
    group.finish();
}

criterion_group!(benches, push_and_pop);
criterion_main!(benches);

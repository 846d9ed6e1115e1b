//! The per-partition micro-batcher: pure logic over items, sizes and instants, no I/O.
//!
//! A batch is closed when it holds `max_items` items, when the next item would take it past
//! `max_bytes` (an item larger than the limit travels alone), or when `linger` has passed since
//! its first item, whichever comes first. Items leave in the order they arrived.
//!
//! Time is a parameter: the caller passes `now` and sleeps until [`Batcher::deadline`], so tests
//! drive it with fixed instants or tokio's paused clock.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::time::Duration;

use tokio::time::Instant;

/// Limits of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatcherSettings {
    /// Most items in a batch.
    pub max_items: NonZeroUsize,
    /// Most bytes in a batch (an item larger than this forms a batch of its own).
    pub max_bytes: NonZeroUsize,
    /// Longest wait after a batch's first item before it is closed.
    pub linger: Duration,
}

impl BatcherSettings {
    /// At most `max_items` records or `max_bytes` bytes per batch, closed `linger` after its
    /// first record at the latest.
    pub fn new(max_items: NonZeroUsize, max_bytes: NonZeroUsize, linger: Duration) -> Self {
        Self {
            max_items,
            max_bytes,
            linger,
        }
    }
}

/// When an open batch closes, besides its size and byte limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Batching {
    /// `linger` after its first record.
    Linger,
    /// The product's default. As soon as no more record is ready to be read (and at least `linger`, then a minimum
    /// wait, after its first record): a record reaching an idle partition worker is applied at
    /// once, and the records that arrive while a transaction runs form the next batch.
    #[default]
    Natural,
}
crate::names::named!(Batching { Linger = "linger", Natural = "natural" });

/// A closed batch.
#[derive(Debug, PartialEq, Eq)]
pub struct Batch<T> {
    /// Items, in arrival order.
    pub items: Vec<T>,
    /// When the first item arrived.
    pub opened: Instant,
}

/// Accumulates items into batches. Closed batches wait in a ready queue until taken.
#[derive(Debug)]
pub struct Batcher<T> {
    settings: BatcherSettings,
    open: Vec<T>,
    open_bytes: usize,
    opened: Option<Instant>,
    ready: VecDeque<Batch<T>>,
}

impl<T> Batcher<T> {
    /// An empty batcher.
    pub fn new(settings: BatcherSettings) -> Self {
        Self {
            settings,
            open: Vec::new(),
            open_bytes: 0,
            opened: None,
            ready: VecDeque::new(),
        }
    }

    /// Adds an item of `size` bytes arriving at `now`.
    pub fn push(&mut self, item: T, size: usize, now: Instant) {
        if !self.open.is_empty() && self.open_bytes.saturating_add(size) > self.max_bytes() {
            self.close();
        }
        if self.open.is_empty() {
            self.opened = Some(now);
            self.open.reserve(self.settings.max_items.get().min(4096));
        }
        self.open.push(item);
        self.open_bytes = self.open_bytes.saturating_add(size);
        if self.open.len() >= self.settings.max_items.get() || self.open_bytes >= self.max_bytes() {
            self.close();
        }
    }

    /// Closes the open batch if its linger has passed at `now`.
    pub fn tick(&mut self, now: Instant) {
        if self.deadline().is_some_and(|d| d <= now) {
            self.close();
        }
    }

    /// Closes the open batch whatever its size (end of partition, shutdown).
    pub fn flush(&mut self) {
        self.close();
    }

    /// Drops every item held, open and closed.
    pub fn clear(&mut self) {
        self.ready.clear();
        self.open.clear();
        self.open_bytes = 0;
        self.opened = None;
    }

    /// True when a closed batch waits to be taken.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Takes the oldest closed batch.
    pub fn pop_ready(&mut self) -> Option<Batch<T>> {
        self.ready.pop_front()
    }

    /// When the open batch must be closed, if there is one.
    pub fn deadline(&self) -> Option<Instant> {
        self.opened.map(|o| o + self.settings.linger)
    }

    /// Items held, open and closed.
    pub fn len(&self) -> usize {
        self.open.len() + self.ready.iter().map(|b| b.items.len()).sum::<usize>()
    }

    /// True when no item is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn max_bytes(&self) -> usize {
        self.settings.max_bytes.get()
    }

    fn close(&mut self) {
        if let Some(opened) = self.opened.take() {
            let items = std::mem::take(&mut self.open);
            self.ready.push_back(Batch { items, opened });
        }
        self.open_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(items: usize, bytes: usize, linger_ms: u64) -> BatcherSettings {
        BatcherSettings {
            max_items: NonZeroUsize::new(items).unwrap(),
            max_bytes: NonZeroUsize::new(bytes).unwrap(),
            linger: Duration::from_millis(linger_ms),
        }
    }

    fn drain(b: &mut Batcher<u32>) -> Vec<Vec<u32>> {
        std::iter::from_fn(|| b.pop_ready().map(|b| b.items)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn closes_at_item_limit_in_arrival_order() {
        let mut b = Batcher::new(settings(3, 1 << 20, 1000));
        for i in 0..7 {
            b.push(i, 1, Instant::now());
        }
        assert_eq!(drain(&mut b), vec![vec![0, 1, 2], vec![3, 4, 5]]);
        assert_eq!(b.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn closes_before_exceeding_byte_limit_and_large_items_travel_alone() {
        let mut b = Batcher::new(settings(100, 10, 1000));
        let now = Instant::now();
        b.push(1, 4, now);
        b.push(2, 4, now);
        b.push(3, 4, now); // 12 > 10: [1, 2] closes first
        b.push(4, 50, now); // larger than the limit: [3] closes, [4] closes alone
        b.push(5, 1, now);
        assert_eq!(drain(&mut b), vec![vec![1, 2], vec![3], vec![4]]);
        assert_eq!(b.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn linger_counts_from_the_first_item() {
        let mut b = Batcher::new(settings(100, 1 << 20, 50));
        let start = Instant::now();
        b.push(1, 1, start);
        assert_eq!(b.deadline(), Some(start + Duration::from_millis(50)));
        tokio::time::advance(Duration::from_millis(30)).await;
        b.push(2, 1, Instant::now());
        b.tick(Instant::now());
        assert!(b.pop_ready().is_none(), "closed before its linger");
        tokio::time::advance(Duration::from_millis(20)).await;
        b.tick(Instant::now());
        let batch = b.pop_ready().unwrap();
        assert_eq!(
            batch,
            Batch {
                items: vec![1, 2],
                opened: start
            }
        );
        assert_eq!(b.deadline(), None);
        b.push(3, 1, Instant::now());
        assert_eq!(
            b.deadline(),
            Some(Instant::now() + Duration::from_millis(50)),
            "the next batch has its own linger"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn flush_closes_a_partial_batch_and_empty_flush_is_a_no_op() {
        let mut b = Batcher::new(settings(100, 1 << 20, 1000));
        b.flush();
        assert!(b.pop_ready().is_none());
        b.push(1, 1, Instant::now());
        b.flush();
        assert_eq!(drain(&mut b), vec![vec![1]]);
        assert!(b.is_empty());
        b.push(2, 1, Instant::now());
        b.flush();
        b.push(3, 1, Instant::now());
        b.clear();
        assert!(b.is_empty() && b.pop_ready().is_none() && b.deadline().is_none());
    }
}

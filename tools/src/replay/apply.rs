//! Applying the decoded batches like the processor does: one task per partition, each applying
//! its batches in order through [`Inbox::apply_batch`] (or, per message, [`Inbox::apply_one`]),
//! all sharing one pool.
//!
//! Invariant: a partition's next batch starts only after its previous one committed; a batch
//! that fails transiently is retried (and counted) like the worker retries it, any other failure
//! ends the replay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use batch_inbox::internals::inbox::{Inbox, TxOutcome};
use batch_inbox::Handler;
use batch_inbox::Mode;
use hdrhistogram::Histogram;

use super::input::PartitionInput;

/// Attempts of one batch before the replay gives up.
const ATTEMPTS: u32 = 20;

/// Totals of a replay.
pub struct Replayed {
    /// Wall time from the first transaction's start to the last one's commit.
    pub elapsed: Duration,
    /// Committed transactions.
    pub transactions: u64,
    /// Attempts that failed transiently and were retried.
    pub retries: u64,
    /// Sum of the transactions' outcomes (records, new, duplicates, …).
    pub outcome: TxOutcome,
    /// Time of each committed transaction, microseconds.
    pub tx_us: Histogram<u64>,
}

/// Applies every partition's batches concurrently; returns once all committed.
pub async fn replay<H: Handler>(
    inbox: Arc<Inbox<H>>,
    topic: &str,
    input: Vec<PartitionInput<H::Payload>>,
    mode: Mode,
) -> Result<Replayed> {
    let topic: Arc<str> = Arc::from(topic);
    let started = Instant::now();
    let tasks: Vec<_> = input
        .into_iter()
        .map(|part| tokio::spawn(apply_partition(inbox.clone(), topic.clone(), part, mode)))
        .collect();
    let mut total = Replayed {
        elapsed: Duration::ZERO,
        transactions: 0,
        retries: 0,
        outcome: TxOutcome::default(),
        tx_us: new_histogram(),
    };
    for task in tasks {
        let part = task.await.context("partition task")??;
        total.transactions += part.transactions;
        total.retries += part.retries;
        add(&mut total.outcome, &part.outcome);
        total.tx_us.add(&part.tx_us).context("histogram")?;
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

async fn apply_partition<H: Handler>(
    inbox: Arc<Inbox<H>>,
    topic: Arc<str>,
    part: PartitionInput<H::Payload>,
    mode: Mode,
) -> Result<Replayed> {
    let mut done = Replayed {
        elapsed: Duration::ZERO,
        transactions: 0,
        retries: 0,
        outcome: TxOutcome::default(),
        tx_us: new_histogram(),
    };
    // Each batch is dropped once applied, as the processor drops it after its commit.
    for batch in part.batches {
        let mut attempt = 1;
        let started = Instant::now();
        let outcome = loop {
            let applied = match mode {
                Mode::PerMessage => inbox.apply_one(&topic, part.partition, &batch).await,
                _ => inbox.apply_batch(&topic, part.partition, &batch).await,
            };
            match applied {
                Ok(outcome) => break outcome,
                Err(e) if e.is_retryable() && attempt < ATTEMPTS => {
                    attempt += 1;
                    done.retries += 1;
                }
                Err(e) => bail!("partition {}: {e}", part.partition),
            }
        };
        let us = started.elapsed().as_micros() as u64;
        done.tx_us.saturating_record(us.max(1));
        done.transactions += 1;
        add(&mut done.outcome, &outcome);
    }
    Ok(done)
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds and precision")
}

fn add(total: &mut TxOutcome, o: &TxOutcome) {
    total.received += o.received;
    total.new += o.new;
    total.duplicates += o.duplicates;
    total.rejected += o.rejected;
    total.poisoned += o.poisoned;
    total.invalid += o.invalid;
    total.dead_letters_written += o.dead_letters_written;
    total.timings += o.timings;
}

//! Poison isolation: a batch the handler fails for a non-transient reason is bisected until the
//! failing messages are alone; the rest commits, each failing message is dead-lettered.
//!
//! Invariants:
//! - parts of a batch are committed one after another, in partition order (depth first, left
//!   half before right half), and each part covers a contiguous offset range, so the offset
//!   stored after a part is always that of a committed prefix;
//! - a message is dead-lettered as poison only after a transaction holding it alone failed
//!   non-transiently; its dead letter is written with its id in the inbox, in a transaction of
//!   its own, so a redelivery of it is a duplicate and is never retried forever;
//! - the number of transactions is bounded: for one poison message in a batch of n, at most
//!   about 2·log2(n) + 2.

use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use super::{
    first_offset, Attempt, BatchClock, OffsetSink, PartitionWorker, TIMEOUTS_BEFORE_SPLIT,
};
use crate::error::{InboxError, RunError};
use crate::fault::Fault;
use crate::pipeline::handler::Handler;
use crate::pipeline::inbox::last_offset;
use crate::pipeline::message::Decoded;

/// A part of a batch waiting for its transaction.
struct Part<P> {
    decoded: Decoded<P>,
    /// Its parent failed and its left sibling then committed whole, so (with a deterministic
    /// handler) it fails too: split it without trying it whole first.
    known_failing: bool,
    /// It is the left half of a failed part: when it commits whole, its sibling is known to fail.
    left_of_failed: bool,
}

impl<P> Part<P> {
    fn new(decoded: Decoded<P>) -> Self {
        Self {
            decoded,
            known_failing: false,
            left_of_failed: false,
        }
    }
}

/// True when `e` is the message's fault (the batch's data): bisecting can isolate it.
pub(super) fn is_poison(e: &InboxError) -> bool {
    e.fault() == Fault::Message
}

/// Splits a part in two halves of its messages; each undecodable record goes with the half
/// whose offset range holds it, so both halves cover contiguous offset ranges. `d` has at least
/// two messages.
fn split<P>(d: Decoded<P>) -> (Decoded<P>, Decoded<P>) {
    let mut left_messages = d.messages;
    let right_messages = left_messages.split_off(left_messages.len() / 2);
    let boundary = right_messages.first().map_or(i64::MAX, |m| m.raw.offset);
    let (left_letters, right_letters) = d
        .dead_letters
        .into_iter()
        .partition(|l| l.raw.offset < boundary);
    (
        Decoded {
            messages: left_messages,
            dead_letters: left_letters,
        },
        Decoded {
            messages: right_messages,
            dead_letters: right_letters,
        },
    )
}

fn timestamps<P>(d: &Decoded<P>) -> Vec<Option<i64>> {
    let a = d.messages.iter().map(|m| m.raw.timestamp_ms);
    a.chain(d.dead_letters.iter().map(|l| l.raw.timestamp_ms))
        .collect()
}

impl<H: Handler, S: OffsetSink + ?Sized> PartitionWorker<H, S> {
    /// Applies `decoded`, isolating poison messages by bisection, and stores offsets after each
    /// committed part. Returns false when abandoned (stopping while the database fails).
    pub(super) async fn apply_isolating(
        &mut self,
        decoded: Decoded<H::Payload>,
        clock: BatchClock,
        stop: &CancellationToken,
        stopping: bool,
    ) -> Result<bool, RunError> {
        let mut stack = vec![Part::new(decoded)];
        while let Some(part) = stack.pop() {
            let alone = part.decoded.messages.len() <= 1;
            if part.known_failing && !alone {
                push_halves(&mut stack, part.decoded);
                continue;
            }
            let error = match self.attempt(&part.decoded, stop, stopping).await? {
                Attempt::Committed(outcome) => {
                    self.breaker.applied(part.decoded.messages.len());
                    let stamps = timestamps(&part.decoded);
                    self.committed(&outcome, last_offset(&part.decoded), clock, &stamps);
                    if part.left_of_failed {
                        if let Some(sibling) = stack.last_mut() {
                            sibling.known_failing = true;
                        }
                    }
                    continue;
                }
                Attempt::Abandoned => return Ok(false),
                Attempt::TimedOut(e) => {
                    tracing::warn!(
                        topic = %self.topic, partition = self.partition,
                        offset = first_offset(&part.decoded), messages = part.decoded.messages.len(),
                        "batch timed out {TIMEOUTS_BEFORE_SPLIT} times, bisecting it: {}",
                        describe(&e)
                    );
                    push_halves(&mut stack, part.decoded);
                    continue;
                }
                Attempt::Failed(e) if is_poison(&e) => e,
                Attempt::Failed(e) => return Err(self.batch_error(first_offset(&part.decoded), e)),
            };
            self.stats.poison_failures.fetch_add(1, Ordering::Relaxed);
            if !alone {
                tracing::warn!(
                    topic = %self.topic, partition = self.partition,
                    offset = first_offset(&part.decoded), messages = part.decoded.messages.len(),
                    "handler failed on a batch, bisecting it: {}", describe(&error)
                );
                push_halves(&mut stack, part.decoded);
                continue;
            }
            if part.decoded.messages.is_empty() {
                // The handler failed with no message to blame: nothing can be isolated.
                return Err(self.batch_error(first_offset(&part.decoded), error));
            }
            let written = match self.breaker.trips() {
                true => {
                    self.stall_on_poison(part.decoded, error, clock, stop, stopping)
                        .await?
                }
                false => {
                    self.dead_letter(part.decoded, &error, clock, stop, stopping)
                        .await?
                }
            };
            if !written {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Dead-letters the single message of `part` as poison. Returns false when abandoned.
    async fn dead_letter(
        &mut self,
        part: Decoded<H::Payload>,
        error: &InboxError,
        clock: BatchClock,
        stop: &CancellationToken,
        stopping: bool,
    ) -> Result<bool, RunError> {
        let first = first_offset(&part);
        let detail = describe(error);
        tracing::warn!(
            topic = %self.topic, partition = self.partition, offset = first,
            "poison message dead-lettered: {detail}"
        );
        let (inbox, topic, partition) = (&self.inbox, &*self.topic, self.partition);
        let (part_ref, detail_ref) = (&part, detail.as_str());
        let attempt = self
            .retry(first, false, stop, stopping, || {
                inbox.dead_letter_poison(topic, partition, part_ref, detail_ref)
            })
            .await?;
        match attempt {
            Attempt::Committed(outcome) => {
                self.committed(&outcome, last_offset(&part), clock, &timestamps(&part));
                Ok(true)
            }
            Attempt::Abandoned => Ok(false),
            Attempt::Failed(e) | Attempt::TimedOut(e) => Err(self.batch_error(first, e)),
        }
    }

    /// The breaker tripped on the single message of `part`: instead of dead-lettering it, the
    /// partition stalls, retrying it with capped backoff, until it commits (its cause was fixed;
    /// the breaker resets). Returns false when abandoned.
    async fn stall_on_poison(
        &mut self,
        part: Decoded<H::Payload>,
        mut error: InboxError,
        clock: BatchClock,
        stop: &CancellationToken,
        stopping: bool,
    ) -> Result<bool, RunError> {
        let first = first_offset(&part);
        let why = self.breaker.limit().map_or_else(String::new, |l| {
            let (percent, window) = (l.share.percent, l.share.window);
            format!(
                " by the poison-rate breaker (more than {percent}% of the partition's last \
                 {window} messages failed, --max-poison-rate {l})"
            )
        });
        let mut failures = 0u32;
        loop {
            failures += 1;
            let delay = self.settings.retry.delay(failures);
            self.stalled_retry(&error, first, failures, delay, &why);
            if !self.pause(delay, stop, stopping).await {
                self.resume(true);
                return Ok(false);
            }
            error = match self.attempt(&part, stop, stopping).await? {
                Attempt::Committed(outcome) => {
                    self.resume(true);
                    self.breaker.reset();
                    self.committed(&outcome, last_offset(&part), clock, &timestamps(&part));
                    return Ok(true);
                }
                Attempt::Abandoned => {
                    self.resume(true);
                    return Ok(false);
                }
                Attempt::Failed(e) if is_poison(&e) => e,
                Attempt::Failed(e) | Attempt::TimedOut(e) => {
                    self.resume(true);
                    return Err(self.batch_error(first, e));
                }
            };
        }
    }
}

/// An error with its chain of causes (a database error's text is in its source).
pub(super) fn describe(error: &InboxError) -> String {
    crate::one_line::chain(error)
}

/// Pushes the halves of a failed part: the left one on top, so it runs first.
fn push_halves<P>(stack: &mut Vec<Part<P>>, decoded: Decoded<P>) {
    let (left, right) = split(decoded);
    stack.push(Part::new(right));
    stack.push(Part {
        left_of_failed: true,
        ..Part::new(left)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::message::{tests::raw, Message};
    use crate::{pipeline::message::DeadLetter, reason::Reason};
    use std::sync::Arc;

    fn decoded(messages: &[i64], letters: &[i64]) -> Decoded<()> {
        let at = |o: i64| Arc::new(raw(o, None, ""));
        Decoded {
            messages: messages
                .iter()
                .map(|&o| Message {
                    id: uuid::Uuid::from_u128(o as u128),
                    payload: (),
                    raw: at(o),
                })
                .collect(),
            dead_letters: letters
                .iter()
                .map(|&o| DeadLetter::new(at(o), None, Reason::InvalidPayload, String::new()))
                .collect(),
        }
    }

    fn offsets(d: &Decoded<()>) -> (Vec<i64>, Vec<i64>) {
        let m = d.messages.iter().map(|m| m.raw.offset).collect();
        (m, d.dead_letters.iter().map(|l| l.raw.offset).collect())
    }

    #[test]
    fn halves_cover_contiguous_offset_ranges() {
        let (left, right) = split(decoded(&[0, 2, 3, 6, 7], &[1, 4, 5, 8]));
        assert_eq!(offsets(&left), (vec![0, 2], vec![1]));
        assert_eq!(offsets(&right), (vec![3, 6, 7], vec![4, 5, 8]));
        assert!(last_offset(&left) < Some(first_offset(&right)));
    }
}

//! Retries of one transaction: transient failures with backoff, environment failures as a stall
//! (nothing committed, dead-lettered or stored; retried on new sessions until it commits), and
//! timeouts, which are bisected when the part has several messages and stall a single one.
//!
//! Invariant: a stall begins and ends within one call of `retry`: the partition is listed as
//! stalled from its first failed attempt until the attempt that commits, or until it is given up
//! (stopping), never longer.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{first_offset, poison, Attempt, OffsetSink, PartitionWorker};
use crate::error::{InboxError, RunError};
use crate::fault::Fault;
use crate::pipeline::handler::Handler;
use crate::pipeline::inbox::{Mode, TxOutcome};
use crate::pipeline::message::Decoded;

/// Timeouts (57014, or no answer within the deadline) of one batch before it is bisected: a
/// batch too big for the statement timeout commits in smaller parts; a single message that keeps
/// timing out stalls its partition instead (a slow database is not the message's fault).
pub(crate) const TIMEOUTS_BEFORE_SPLIT: u32 = 3;

/// Retry schedule for transient failures: exponential with full jitter, capped.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Delay before the first retry (before jitter).
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl RetryPolicy {
    /// Retries from `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// Delay before retry number `attempt` (1-based): uniformly in [cap/2, cap].
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        let cap = self.initial.saturating_mul(factor).min(self.max);
        let half = cap / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

impl<H: Handler, S: OffsetSink + ?Sized> PartitionWorker<H, S> {
    /// One transaction of `part` (batched or per-message, as configured), retried while it
    /// fails transiently.
    pub(super) async fn attempt(
        &self,
        part: &Decoded<H::Payload>,
        stop: &CancellationToken,
        stopping: bool,
    ) -> Result<Attempt, RunError> {
        let (inbox, topic, partition) = (&self.inbox, &*self.topic, self.partition);
        let per_message = self.settings.mode == Mode::PerMessage;
        let splittable = part.messages.len() > 1;
        self.retry(
            first_offset(part),
            splittable,
            stop,
            stopping,
            || async move {
                if per_message {
                    inbox.apply_one(topic, partition, part).await
                } else {
                    inbox.apply_batch(topic, partition, part).await
                }
            },
        )
        .await
    }

    /// Runs `attempt` until it commits, retrying transient failures with backoff and stalling
    /// on the environment's. A `splittable` part (more than one message) that keeps timing out
    /// is handed back to be bisected; a single message that does stalls.
    pub(super) async fn retry<F, Fut>(
        &self,
        first_offset: i64,
        splittable: bool,
        stop: &CancellationToken,
        stopping: bool,
        mut attempt: F,
    ) -> Result<Attempt, RunError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<TxOutcome, InboxError>>,
    {
        let (mut failures, mut timeouts) = (0u32, 0u32);
        // Whether this batch stalled: a stall begins and ends within one call.
        let mut stalled = false;
        loop {
            let error = match attempt().await {
                Ok(outcome) => {
                    self.resume(stalled);
                    return Ok(Attempt::Committed(outcome));
                }
                Err(e) if e.fault() == Fault::Message => {
                    self.resume(stalled);
                    return Ok(Attempt::Failed(e));
                }
                Err(InboxError::PositionMoved { expected }) => {
                    // Not retried: the worker moves to the database's position (module
                    // `positions`), where the records of this attempt come again.
                    self.resume(stalled);
                    return Err(RunError::PositionMoved {
                        topic: self.topic.to_string(),
                        partition: self.partition,
                        expected,
                        stored: None,
                    });
                }
                Err(e) => e,
            };
            failures += 1;
            timeouts += u32::from(error.is_timeout());
            let timed_out = timeouts >= TIMEOUTS_BEFORE_SPLIT;
            if timed_out && splittable {
                self.resume(stalled);
                return Ok(Attempt::TimedOut(error));
            }
            let delay = self.settings.retry.delay(failures);
            if error.fault() == Fault::Environment || timed_out {
                stalled = true;
                self.stalled_retry(&error, first_offset, failures, delay, "");
            } else {
                self.stats.record_retry();
                tracing::warn!(
                    topic = %self.topic, partition = self.partition, offset = first_offset,
                    attempt = failures, retry_in_ms = delay.as_millis() as u64,
                    "batch failed, will retry: {error}"
                );
            }
            if !self.pause(delay, stop, stopping).await {
                // Shutting down while the database fails: leave the batch for redelivery.
                self.resume(stalled);
                return Ok(Attempt::Abandoned);
            }
        }
    }

    /// Records one failed attempt of a stalled partition: not the message's fault, so nothing is
    /// committed, dead-lettered or stored; the batch waits, retried, until the operator fixes
    /// the cause, on new sessions (statements prepared again, the database's settings read
    /// again). `why` says what stalled it when it is not the error's class (the breaker).
    pub(super) fn stalled_retry(
        &self,
        error: &InboxError,
        first_offset: i64,
        attempt: u32,
        delay: Duration,
        why: &str,
    ) {
        let sqlstate = error.sqlstate().unwrap_or(if error.is_timeout() {
            "timeout"
        } else {
            "none"
        });
        let stalls = &self.stats.telemetry.stalls;
        match why.is_empty() {
            true => stalls.retrying(&self.topic, self.partition, sqlstate),
            false => stalls.retrying_on_breaker(&self.topic, self.partition, sqlstate),
        }
        self.inbox.reset_connections();
        let why = match why.is_empty() {
            true => "not the message's fault (nothing dead-lettered)",
            false => why,
        };
        tracing::warn!(
            topic = %self.topic, partition = self.partition, offset = first_offset,
            sqlstate, attempt, retry_in_ms = delay.as_millis() as u64,
            "partition stalled, {why}, will retry: {}", poison::describe(error)
        );
    }

    /// Ends this partition's stall, if it `stalled`.
    pub(super) fn resume(&self, stalled: bool) {
        if stalled {
            self.stats
                .telemetry
                .stalls
                .resumed(&self.topic, self.partition);
        }
    }

    /// Waits `delay` before a retry. False when the worker is stopping (now or meanwhile).
    pub(super) async fn pause(
        &self,
        delay: Duration,
        stop: &CancellationToken,
        stopping: bool,
    ) -> bool {
        if stopping || stop.is_cancelled() {
            return false;
        }
        tokio::select! {
            _ = stop.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

//! The business trait: what a service implements to get dedup, batching, dead letters and offset
//! management from the pipeline.
//!
//! Invariant: a handler only ever sees messages whose ids were new to the inbox in this very
//! transaction, in partition order, and only ever gets that transaction to work with. Its effects
//! commit together with the inbox rows, or not at all.

use std::future::Future;

use crate::db::Transaction;

use crate::error::HandlerError;
use crate::pipeline::message::{Decode, Message};
use crate::reason::Reason;

/// A message the handler refused for a business reason. It stays in the inbox (it is never
/// evaluated again on redelivery) and gets a dead-letter record in the same transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Index of the message in the slice given to the handler.
    pub index: usize,
    /// Why it was refused.
    pub reason: Reason,
    /// Human-readable detail.
    pub detail: String,
}

impl Rejection {
    /// Refuses message `index` of the handler's slice for `reason`.
    pub fn new(index: usize, reason: Reason, detail: impl Into<String>) -> Self {
        Self {
            index,
            reason,
            detail: detail.into(),
        }
    }
}

/// The business logic applied to new messages, inside the inbox transaction.
pub trait Handler: Send + Sync + 'static {
    /// The decoded message value.
    type Payload: Decode + Clone + Send + Sync + 'static;

    /// The reasons this handler rejects messages with (its [`Rejection`]s' [`Reason::Rejected`]
    /// names), so that their dead-letter counters show from the start, at 0.
    const REJECTIONS: &'static [Reason] = &[];

    /// Applies `messages` (new ids only, in partition order) using `tx` only. Returns the
    /// messages it refused; an `Err` rolls the whole batch back.
    fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Self::Payload>],
    ) -> impl Future<Output = Result<Vec<Rejection>, HandlerError>> + Send;

    /// The statements [`Handler::handle`] prepares on every batch, prepared on the pool's
    /// connections when the processor starts, while the consumer joins its group, so that the
    /// first batches do not pay for connecting and planning. The default: none (the first batch
    /// on each connection prepares them).
    fn statements(&self) -> Vec<String> {
        Vec::new()
    }

    /// Applies one new message: the per-message baseline's path. The default calls
    /// [`Handler::handle`] with a one-element slice; a handler may provide a leaner version with
    /// the same semantics.
    fn handle_one(
        &self,
        tx: &Transaction<'_>,
        message: &Message<Self::Payload>,
    ) -> impl Future<Output = Result<Option<Rejection>, HandlerError>> + Send {
        async move {
            let mut rejected = self.handle(tx, std::slice::from_ref(message)).await?;
            Ok(rejected.pop())
        }
    }
}

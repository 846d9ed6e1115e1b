//! Content never fails a batch: when the dead-letter statement refuses a transaction's full rows
//! for a reason retrying cannot fix (a value PostgreSQL will not store, a constraint), the
//! transaction runs once more, whole, with minimal dead-letter rows (position, reason, key,
//! payload, and a detail naming the SQLSTATE; [`crate::pipeline::dead_letter::RowForm::minimal`]).
//!
//! Invariant: the normal path costs nothing more (no savepoint, no extra statement); a refused
//! transaction costs one more. If the minimal rows are refused too, the error stands.

use super::{Inbox, InboxError, TxOutcome};
use crate::pipeline::dead_letter::RowForm;
use crate::pipeline::handler::Handler;

impl<H: Handler> Inbox<H> {
    /// Full dead-letter rows, or minimal ones after full ones were refused with `refused`.
    pub(super) fn rows<'a>(&'a self, refused: Option<&'a str>) -> RowForm<'a> {
        match refused {
            None => RowForm::full(&self.decoding.ids),
            Some(state) => RowForm::minimal(&self.decoding.ids, state),
        }
    }
}

/// The SQLSTATE with which the dead-letter statement refused a transaction's full rows for a
/// reason retrying cannot fix (`"none"` for a client-side failure), if it did. Content must never
/// fail a batch: the caller then runs the transaction once more with minimal rows.
pub(super) fn refused_rows(
    result: &Result<TxOutcome, InboxError>,
    topic: &str,
    partition: i32,
) -> Option<String> {
    let Err(InboxError::DeadLetters(e)) = result else {
        return None;
    };
    if crate::fault::is_retryable_db(e) {
        return None;
    }
    let state = e.code().map_or("none", |c| c.code()).to_owned();
    tracing::warn!(
        topic, partition, sqlstate = %state,
        "dead-letter rows refused; writing the batch's dead letters in minimal form"
    );
    Some(state)
}

//! Content never fails a batch: when the dead-letter statement refuses a transaction's full rows
//! for a reason retrying cannot fix (a value PostgreSQL will not store, a constraint), the
//! transaction runs once more, whole, with minimal dead-letter rows (position, reason, key,
//! payload, and a detail naming the SQLSTATE; [`crate::dead_letter::RowForm::minimal`]).
//!
//! Invariant: the normal path costs nothing more (no savepoint, no extra statement); a refused
//! transaction costs one more. If the minimal rows are refused too, the error stands.

use super::{Inbox, InboxError, TxOutcome};
use crate::dead_letter::RowForm;
use crate::handler::Handler;
use crate::message::Decoded;

impl<H: Handler> Inbox<H> {
    /// Applies one decoded batch of one partition in one transaction.
    pub async fn apply_batch(
        &self,
        topic: &str,
        partition: i32,
        batch: &Decoded<H::Payload>,
    ) -> Result<TxOutcome, InboxError> {
        let full = self
            .apply_batch_as(topic, partition, batch, self.rows(None))
            .await;
        let Some(state) = refused_rows(&full, topic, partition) else {
            return full;
        };
        let rows = self.rows(Some(&state));
        self.apply_batch_as(topic, partition, batch, rows).await
    }

    /// Applies one record in its own transaction (the per-message baseline).
    pub async fn apply_one(
        &self,
        topic: &str,
        partition: i32,
        record: &Decoded<H::Payload>,
    ) -> Result<TxOutcome, InboxError> {
        let full = self
            .apply_one_as(topic, partition, record, self.rows(None))
            .await;
        let Some(state) = refused_rows(&full, topic, partition) else {
            return full;
        };
        let rows = self.rows(Some(&state));
        self.apply_one_as(topic, partition, record, rows).await
    }

    /// Records the messages of `part` as poison, without calling the handler: their ids go to
    /// the inbox (so a redelivery is a duplicate, not a new failure) and each new one gets a
    /// `handler_error` dead letter with `error` as detail, in one transaction that also writes
    /// the part's undecodable records and its next offset.
    pub async fn dead_letter_poison(
        &self,
        topic: &str,
        partition: i32,
        part: &Decoded<H::Payload>,
        error: &str,
    ) -> Result<TxOutcome, InboxError> {
        let full = self
            .poison_as(topic, partition, part, error, self.rows(None))
            .await;
        let Some(state) = refused_rows(&full, topic, partition) else {
            return full;
        };
        let rows = self.rows(Some(&state));
        self.poison_as(topic, partition, part, error, rows).await
    }

    /// Full dead-letter rows, or minimal ones after full ones were refused with `refused`.
    fn rows<'a>(&'a self, refused: Option<&'a str>) -> RowForm<'a> {
        match refused {
            None => RowForm::full(&self.id_header),
            Some(state) => RowForm::minimal(&self.id_header, state),
        }
    }
}

/// The SQLSTATE with which the dead-letter statement refused a transaction's full rows for a
/// reason retrying cannot fix (`"none"` for a client-side failure), if it did. Content must never
/// fail a batch: the caller then runs the transaction once more with minimal rows.
fn refused_rows(
    result: &Result<TxOutcome, InboxError>,
    topic: &str,
    partition: i32,
) -> Option<String> {
    let Err(InboxError::DeadLetters(e)) = result else {
        return None;
    };
    if crate::error::is_retryable_db(e) {
        return None;
    }
    let state = e.code().map_or("none", |c| c.code()).to_owned();
    tracing::warn!(
        topic, partition, sqlstate = %state,
        "dead-letter rows refused; writing the batch's dead letters in minimal form"
    );
    Some(state)
}

//! A transaction beside the inbox transaction: the dead letter of a poison message.
//!
//! Invariant: it records the partition's next offset like the inbox transaction does, and puts
//! the message's id in the inbox, so a redelivery is a duplicate.

use deadpool_postgres::Client;

use super::transaction::insert_ids;
use super::TxOutcome;
use crate::error::InboxError;
use crate::failpoint::failpoint;
use crate::pipeline::dead_letter::{self, RowForm};
use crate::pipeline::message::dedup_in_batch;
use crate::pipeline::message::DeadLetter;
use crate::pipeline::message::{Decoded, Message};
use crate::reason::Reason;
use crate::source::positions::OffsetTarget;

/// See [`super::Inbox::dead_letter_poison`].
pub(super) async fn dead_letter_poison<P>(
    client: &mut Client,
    (topic, partition): (&str, i32),
    part: &Decoded<P>,
    error: &str,
    target: Option<OffsetTarget<'_>>,
    rows: RowForm<'_>,
) -> Result<TxOutcome, InboxError> {
    let tx = client.transaction().await?;
    let mut unique: Vec<&Message<P>> = part.messages.iter().collect();
    dedup_in_batch(&mut unique, |m| m.id);
    let new_ids = insert_ids(&tx, (topic, partition), &unique, target).await?;
    let mut letters = part.dead_letters.clone();
    letters.extend(unique.iter().filter(|m| new_ids.contains(&m.id)).map(|m| {
        let id = Some(m.id.to_string());
        DeadLetter::new(m.raw.clone(), id, Reason::HandlerError, error.to_owned())
    }));
    let written = dead_letter::insert(&tx, topic, partition, &letters, rows)
        .await
        .map_err(InboxError::DeadLetters)?;
    failpoint!("before_commit");
    tx.commit().await?;
    Ok(TxOutcome {
        received: (part.messages.len() + part.dead_letters.len()) as u64,
        new: new_ids.len() as u64,
        duplicates: (part.messages.len() - new_ids.len()) as u64,
        poisoned: new_ids.len() as u64,
        invalid: part.dead_letters.len() as u64,
        dead_letters_written: written,
        ..TxOutcome::default()
    })
}

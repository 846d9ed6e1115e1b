//! The UNSAFE no-inbox control (`unsafe-controls` builds only): the batched transaction without
//! dedup and without inbox rows, so that fault checks can show they detect double application.
//!
//! Invariant: it records the partition's next offset like the inbox transaction does, so the
//! only thing it breaks is the dedup.

use deadpool_postgres::Client;

use super::transaction::rejected_letter;
use super::TxOutcome;
use crate::error::InboxError;
use crate::failpoint::failpoint;
use crate::pipeline::dead_letter::{self, RowForm};
use crate::pipeline::handler::Handler;
use crate::pipeline::message::Decoded;
use crate::source::positions::{self, OffsetTarget};

/// The UNSAFE control: the batched transaction without dedup (every record is new, in-batch
/// copies included) and without inbox rows. Only for showing that fault checks detect double
/// application.
pub(super) async fn apply_without_inbox<H: Handler>(
    client: &mut Client,
    handler: &H,
    (topic, partition): (&str, i32),
    batch: &Decoded<H::Payload>,
    target: Option<OffsetTarget<'_>>,
    rows: RowForm<'_>,
) -> Result<TxOutcome, InboxError> {
    let tx = client.transaction().await?;
    if let Some(t) = target {
        positions::store(&tx, topic, partition, t).await?;
    }
    let rejections = handler.handle(&tx, &batch.messages).await?;
    let mut letters = batch.dead_letters.clone();
    for r in &rejections {
        letters.push(rejected_letter(&batch.messages, r)?);
    }
    let written = dead_letter::insert(&tx, topic, partition, &letters, rows)
        .await
        .map_err(InboxError::DeadLetters)?;
    failpoint!("before_commit");
    tx.commit().await?;
    Ok(TxOutcome {
        received: (batch.messages.len() + batch.dead_letters.len()) as u64,
        new: batch.messages.len() as u64,
        rejected: rejections.len() as u64,
        invalid: batch.dead_letters.len() as u64,
        dead_letters_written: written,
        ..TxOutcome::default()
    })
}

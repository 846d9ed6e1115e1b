//! The inbox's dedup and handler steps inside a transaction the caller owns (a redrive's): no
//! dead letters, no offsets, no COMMIT.
//!
//! Invariant: the same rule as the inbox transaction's, by the same code: later copies of an id
//! are dropped (first occurrence wins), the ids go in with the inbox's own insert, and the
//! handler gets only the messages whose ids that insert found new, in the given order, and only
//! `tx`.

use std::collections::{BTreeMap, HashSet};

use super::transaction::{insert_ids, rejected_letter};
use crate::db::Transaction;
use crate::error::InboxError;
use crate::pipeline::handler::{Handler, Rejection};
use crate::pipeline::message::{dedup_in_batch, Message};

/// What [`apply_within`] did.
#[derive(Debug)]
pub(crate) struct Applied<P> {
    /// The messages whose ids were new, as the handler got them.
    pub fresh: Vec<Message<P>>,
    /// Those the handler refused (indexes into `fresh`, checked).
    pub rejections: Vec<Rejection>,
}

/// Inserts the ids of `messages` (of any topics and partitions) into the inbox within `tx` and
/// runs `handler` on the new ones. Each message's inbox row records its own position.
pub(crate) async fn apply_within<H: Handler>(
    tx: &Transaction<'_>,
    handler: &H,
    messages: &[Message<H::Payload>],
) -> Result<Applied<H::Payload>, InboxError> {
    let mut unique: Vec<&Message<H::Payload>> = messages.iter().collect();
    dedup_in_batch(&mut unique, |m| m.id);
    let mut by_partition: BTreeMap<(&str, i32), Vec<&Message<H::Payload>>> = BTreeMap::new();
    for m in &unique {
        by_partition
            .entry((&m.raw.topic, m.raw.partition))
            .or_default()
            .push(m);
    }
    let mut new_ids = HashSet::new();
    for (at, group) in by_partition {
        new_ids.extend(insert_ids(tx, at, &group, None).await?);
    }
    let fresh: Vec<Message<H::Payload>> = unique
        .into_iter()
        .filter(|m| new_ids.contains(&m.id))
        .cloned()
        .collect();
    let rejections = handler.handle(tx, &fresh).await?;
    for r in &rejections {
        rejected_letter(&fresh, r)?;
    }
    Ok(Applied { fresh, rejections })
}

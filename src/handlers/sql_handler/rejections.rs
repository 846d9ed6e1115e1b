//! Rejections from the statement's result: rows with a `message_id` (uuid or text) and a
//! `reason` (text) column, and optionally a `detail` (text) column, name the messages it refuses.
//!
//! Invariants: a result without both columns is ignored; a row never crashes the batch by its
//! content: a reason that is not a valid name ([`RejectReason::new`]) dead-letters its message as
//! `handler_error` with the reason quoted in the detail. Only a row that names no message of the
//! statement's input (NULL, not a UUID, another id) fails the batch: the statement is wrong, not
//! a message, so it is the environment's fault and the partition stalls (nothing committed or
//! dead-lettered) until the process runs a fixed statement.

use std::collections::HashMap;

use tokio_postgres::types::Type;
use tokio_postgres::{Column, Row};
use uuid::Uuid;

use super::JsonPayload;
use crate::pipeline::handler::Rejection;
use crate::pipeline::message::Message;
use crate::reason::{Reason, RejectReason};

/// Where a result's rejection columns are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RejectionColumns {
    message_id: usize,
    id_is_uuid: bool,
    reason: usize,
    detail: Option<usize>,
}

/// Column types read as text.
const TEXT_TYPES: [Type; 3] = [Type::TEXT, Type::VARCHAR, Type::BPCHAR];

impl RejectionColumns {
    /// The rejection columns of a result, `None` when it does not have both `message_id` and
    /// `reason` (its rows are ignored), or why their types do not fit.
    pub(super) fn of(columns: &[Column]) -> Result<Option<Self>, String> {
        let find = |name: &str| columns.iter().position(|c| c.name() == name);
        let (Some(message_id), Some(reason)) = (find("message_id"), find("reason")) else {
            return Ok(None);
        };
        let is_text = |i: usize| TEXT_TYPES.contains(columns[i].type_());
        let id_type = columns[message_id].type_();
        if *id_type != Type::UUID && !is_text(message_id) {
            return Err(format!(
                "the result's column message_id is {id_type}; rejections need uuid or text"
            ));
        }
        if !is_text(reason) {
            let t = columns[reason].type_();
            return Err(format!(
                "the result's column reason is {t}; rejections need text"
            ));
        }
        let detail = find("detail");
        if let Some(d) = detail.filter(|d| !is_text(*d)) {
            let t = columns[d].type_();
            return Err(format!(
                "the result's column detail is {t}; rejections need text"
            ));
        }
        Ok(Some(Self {
            message_id,
            id_is_uuid: *id_type == Type::UUID,
            reason,
            detail,
        }))
    }
}

/// A result row that names no message of the statement's input.
#[derive(Debug, thiserror::Error)]
#[error("the statement returned message_id {0}, which is not one of its input's messages")]
pub(super) struct UnknownMessage(String);

/// The rejections named by `rows`, by index in `messages`; one per message (the first row wins).
pub(super) fn rejections(
    columns: RejectionColumns,
    rows: &[Row],
    messages: &[&Message<JsonPayload>],
) -> Result<Vec<Rejection>, UnknownMessage> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let index: HashMap<Uuid, usize> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| (m.id, i))
        .collect();
    let mut found: HashMap<usize, Rejection> = HashMap::new();
    for row in rows {
        let id = message_id(columns, row)?;
        let Some(&i) = index.get(&id) else {
            return Err(UnknownMessage(id.to_string()));
        };
        let reason: Option<String> = row.try_get(columns.reason).unwrap_or(None);
        let detail: Option<String> = columns.detail.and_then(|d| row.try_get(d).unwrap_or(None));
        found
            .entry(i)
            .or_insert_with(|| rejection(i, reason.as_deref(), detail));
    }
    let mut out: Vec<Rejection> = found.into_values().collect();
    out.sort_by_key(|r| r.index);
    Ok(out)
}

fn message_id(columns: RejectionColumns, row: &Row) -> Result<Uuid, UnknownMessage> {
    let i = columns.message_id;
    if columns.id_is_uuid {
        let id: Option<Uuid> = row.try_get(i).unwrap_or(None);
        return id.ok_or_else(|| UnknownMessage("NULL".to_owned()));
    }
    let text: Option<String> = row.try_get(i).unwrap_or(None);
    match text {
        None => Err(UnknownMessage("NULL".to_owned())),
        Some(t) => Uuid::parse_str(t.trim()).map_err(|_| UnknownMessage(quote(&t))),
    }
}

/// The rejection of message `index` for `reason`: a `handler_error` quoting the reason when it
/// is not a valid name.
pub(super) fn rejection(index: usize, reason: Option<&str>, detail: Option<String>) -> Rejection {
    let detail = detail.unwrap_or_else(|| "rejected by the SQL statement".to_owned());
    match reason.map(RejectReason::new) {
        Some(Ok(name)) => Rejection::new(index, Reason::Rejected(name), detail),
        Some(Err(e)) => Rejection::new(
            index,
            Reason::HandlerError,
            format!(
                "the statement rejected it with reason {}, which is not a valid name ({e}); \
                 detail: {detail}",
                quote(reason.unwrap_or_default())
            ),
        ),
        None => Rejection::new(
            index,
            Reason::HandlerError,
            format!("the statement rejected it with reason NULL; detail: {detail}"),
        ),
    }
}

/// `text` quoted with escapes, cut to 100 characters.
fn quote(text: &str) -> String {
    let cut: String = text.chars().take(100).collect();
    let more = if cut.len() < text.len() { "…" } else { "" };
    format!("{cut:?}{more}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_name_is_a_rejection_and_any_other_a_quoted_handler_error() {
        let ok = rejection(2, Some("over_limit"), Some("3 > 2".to_owned()));
        assert_eq!(
            ok,
            Rejection::new(2, Reason::rejected("over_limit"), "3 > 2")
        );
        let bad = rejection(0, Some("Over Limit\n"), None);
        assert_eq!(bad.reason, Reason::HandlerError);
        assert!(
            bad.detail.contains("\"Over Limit\\n\"")
                && bad.detail.contains("rejected by the SQL statement"),
            "{}",
            bad.detail
        );
        let long = "x".repeat(500);
        let cut = rejection(0, Some(&long), None);
        assert!(cut.detail.len() < 300, "{}", cut.detail);
        assert_eq!(rejection(1, None, None).reason, Reason::HandlerError);
    }
}

//! The reference handler: account balances that never go below zero.
//!
//! Rules (pure, in [`apply`]): per account, entries take effect in partition order; an account is
//! created at 0 by its first message; a debit that would take the balance below zero, or an amount
//! that would overflow it, is rejected and changes nothing.
//!
//! Batched path (`batched`): one guarded `UPDATE` applies every account whose balance takes all
//! of the batch's entries (`guard`); the other accounts are locked in ascending order
//! (`FOR UPDATE … ORDER BY`), created at 0 when missing, and go through the rules in memory.
//! Concurrent batches over the same existing accounts never deadlock.
//!
//! Its table, `balances`, is its own: [`migrate`] creates it, apart from the core's tables.

use std::collections::HashMap;

use crate::db::Transaction;
use serde::Deserialize;

use crate::db::sql::ledger::{APPLY_ONE, ENSURE_ONE, READ_ONE};
use crate::error::HandlerError;
use crate::pipeline::handler::{Handler, Rejection};
use crate::pipeline::message::{Decode, Message, RawMessage};
use crate::reason::Reason;

/// The ledger's rejection: a debit that would take the balance below zero.
pub const INSUFFICIENT_FUNDS: Reason = Reason::rejected("insufficient_funds");
/// The ledger's rejection: an amount that would overflow the balance.
pub const AMOUNT_OVERFLOW: Reason = Reason::rejected("amount_overflow");

mod batched;
pub(crate) mod guard;
mod schema;

pub use schema::{check_schema, migrate, MIGRATIONS, OWNER};

/// One ledger entry: the message value `{"account_id": i64, "amount": i64}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct Entry {
    /// The account.
    pub account_id: i64,
    /// Minor units; negative is a debit.
    pub amount: i64,
}

impl Decode for Entry {
    fn decode(raw: &RawMessage) -> Result<Self, (Reason, String)> {
        Entry::parse(raw.payload.as_deref())
    }
}

impl Entry {
    /// Parses a record value: the decoder's rules, shared with the generator's model.
    pub fn parse(value: Option<&[u8]>) -> Result<Self, (Reason, String)> {
        match value {
            None | Some(b"") => Err((Reason::EmptyPayload, "the record has no value".to_owned())),
            Some(bytes) => {
                let expected = "expected {\"account_id\": i64, \"amount\": i64}";
                // serde also reads a struct from an array; the contract is an object.
                if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
                    return Err((Reason::InvalidPayload, format!("{expected}: not an object")));
                }
                serde_json::from_slice(bytes)
                    .map_err(|e| (Reason::InvalidPayload, format!("{expected}: {e}")))
            }
        }
    }
}

/// Applies one amount to a balance, or says why it is refused.
pub fn apply_amount(balance: i64, amount: i64) -> Result<i64, (Reason, String)> {
    match balance.checked_add(amount) {
        Some(next) if next >= 0 => Ok(next),
        Some(_) => Err((
            INSUFFICIENT_FUNDS,
            format!("balance {balance} cannot cover {amount}"),
        )),
        None => Err((
            AMOUNT_OVERFLOW,
            format!("balance {balance} plus {amount} overflows"),
        )),
    }
}

/// Applies entries in order to `balances` (accounts missing from the map start at 0) and returns
/// the refused entries by index.
pub fn apply<'a>(
    balances: &mut HashMap<i64, i64>,
    entries: impl IntoIterator<Item = &'a Entry>,
) -> Vec<Rejection> {
    apply_indexed(balances, entries.into_iter().enumerate())
}

/// [`apply`] for entries that carry their index in the batch (a subset of it, in order).
pub(crate) fn apply_indexed<'a>(
    balances: &mut HashMap<i64, i64>,
    entries: impl IntoIterator<Item = (usize, &'a Entry)>,
) -> Vec<Rejection> {
    let mut rejected = Vec::new();
    for (index, entry) in entries {
        let balance = balances.entry(entry.account_id).or_insert(0);
        match apply_amount(*balance, entry.amount) {
            Ok(next) => *balance = next,
            Err((reason, detail)) => rejected.push(Rejection {
                index,
                reason,
                detail,
            }),
        }
    }
    rejected
}

/// The ledger handler.
#[derive(Debug, Default, Clone, Copy)]
pub struct Ledger;

impl Handler for Ledger {
    type Payload = Entry;

    const REJECTIONS: &'static [Reason] = &[INSUFFICIENT_FUNDS, AMOUNT_OVERFLOW];

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        batched::handle(tx, messages).await
    }

    fn statements(&self) -> Vec<String> {
        batched::STATEMENTS.iter().map(|s| s.to_string()).collect()
    }

    async fn handle_one(
        &self,
        tx: &Transaction<'_>,
        message: &Message<Entry>,
    ) -> Result<Option<Rejection>, HandlerError> {
        let Entry { account_id, amount } = message.payload;
        let ensure = tx.prepare_cached(ENSURE_ONE).await?;
        tx.execute(&ensure, &[&account_id]).await?;
        let apply_one = tx.prepare_cached(APPLY_ONE).await?;
        if tx
            .query_opt(&apply_one, &[&account_id, &amount])
            .await?
            .is_some()
        {
            return Ok(None);
        }
        // Refused: read the balance only to say why.
        let read = tx.prepare_cached(READ_ONE).await?;
        let balance: i64 = tx.query_one(&read, &[&account_id]).await?.get(0);
        let (reason, detail) = apply_amount(balance, amount)
            .err()
            .unwrap_or((INSUFFICIENT_FUNDS, format!("balance {balance}")));
        Ok(Some(Rejection {
            index: 0,
            reason,
            detail,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::message::tests::raw;

    fn e(account_id: i64, amount: i64) -> Entry {
        Entry { account_id, amount }
    }

    #[test]
    fn debits_are_rejected_in_partition_order() {
        let mut balances = HashMap::new();
        let entries = [e(1, -5), e(1, 10), e(1, -7), e(1, -7), e(2, 3)];
        let rejected = apply(&mut balances, &entries);
        let refused: Vec<(usize, Reason)> = rejected
            .iter()
            .map(|r| (r.index, r.reason.clone()))
            .collect();
        assert_eq!(
            refused,
            vec![(0, INSUFFICIENT_FUNDS), (3, INSUFFICIENT_FUNDS)]
        );
        assert_eq!(balances, HashMap::from([(1, 3), (2, 3)]));
    }

    #[test]
    fn overflow_is_rejected_not_wrapped() {
        assert_eq!(apply_amount(i64::MAX, 1).unwrap_err().0, AMOUNT_OVERFLOW);
        assert_eq!(apply_amount(5, -5), Ok(0));
    }

    #[test]
    fn values_decode_or_say_why_not() {
        let ok = raw(0, None, r#"{"account_id": 7, "amount": -3}"#);
        assert_eq!(Entry::decode(&ok), Ok(e(7, -3)));
        for (payload, reason) in [
            ("", Reason::EmptyPayload),
            ("{", Reason::InvalidPayload),
            (
                r#"{"account_id": "7", "amount": 1}"#,
                Reason::InvalidPayload,
            ),
            (r#"{"account_id": 7}"#, Reason::InvalidPayload),
            (
                r#"{"account_id": 7, "amount": 1.5}"#,
                Reason::InvalidPayload,
            ),
            ("[1, 2]", Reason::InvalidPayload),
        ] {
            assert_eq!(
                Entry::decode(&raw(0, None, payload)).unwrap_err().0,
                reason,
                "{payload}"
            );
        }
        let mut none = raw(0, None, "");
        none.payload = None;
        assert_eq!(Entry::decode(&none).unwrap_err().0, Reason::EmptyPayload);
    }
}

//! The ledger's batched path: an optimistic guarded update, then the exact rules for the accounts
//! it could not take.
//!
//! 1. One `UPDATE … WHERE balance BETWEEN need AND headroom`, in ascending account order, applies
//!    the net change of every account whose balance takes all its entries ([`super::guard`]). Each
//!    such row is written once, instead of locked and then written.
//! 2. The other accounts (an entry of theirs is refused, or they do not exist yet) take the exact
//!    path: locked in ascending order, created at 0 when missing, the rules run in memory
//!    ([`super::apply_indexed`]), the changed balances written with one statement.
//!
//! Every plan is a nested loop of primary-key probes in the batch's ascending account order,
//! whatever the table's statistics: the transaction's first round trip turns hash joins, merge
//! joins and sequential scans off for it ([`PLANNER`]).
//!
//! Invariant: no batch waits for a row lock out of ascending account order while it holds
//! balance locks, so batches over the same existing accounts never deadlock. Step 1 locks in
//! ascending order; step 2 would lock below rows step 1 holds, so it does not wait: it locks
//! with `NOWAIT` after a savepoint taken before step 1, and a busy row rolls the batch back to
//! that savepoint and takes the exact path for every account, waiting in ascending order. As
//! before, creating an account waits for a concurrent creator of the same account.

use std::collections::{HashMap, HashSet};

use tokio_postgres::error::SqlState;

use super::guard::{self, Guard};
use super::{apply_indexed, Entry};
use crate::db::sql::ledger::{
    ENSURE_ACCOUNTS, GUARDED_UPDATE, LOCK_ACCOUNTS, LOCK_ACCOUNTS_NOWAIT, PLANNER,
    PLANNER_AND_SAVEPOINT, ROLLBACK_TO_SAVEPOINT, WRITE_BALANCES,
};
use crate::db::Transaction;
use crate::error::HandlerError;
use crate::pipeline::handler::Rejection;
use crate::pipeline::message::Message;

/// The statements of a batch that goes the usual way: the guarded update, then the exact path's
/// lock, creation and write.
pub(super) const STATEMENTS: [&str; 4] = [
    GUARDED_UPDATE,
    LOCK_ACCOUNTS,
    ENSURE_ACCOUNTS,
    WRITE_BALANCES,
];

/// Whether the exact path may wait for a row lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Locking {
    /// Wait: the batch holds no balance lock out of order.
    Wait,
    /// Fail at once with `55P03` on a busy row: the optimistic update holds locks above it.
    NoWait,
}

/// Applies `messages` (new ids, partition order) to the balances; returns the refused entries.
pub(super) async fn handle(
    tx: &Transaction<'_>,
    messages: &[Message<Entry>],
) -> Result<Vec<Rejection>, HandlerError> {
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    let guards = guard::guards(messages.iter().map(|m| &m.payload));
    let accounts: Vec<i64> = guards.iter().map(|(account, _)| *account).collect();
    let fast: Vec<Guard> = guards.iter().filter_map(|(_, g)| *g).collect();
    if fast.is_empty() {
        return apply_exact(tx, messages, &accounts, Locking::Wait, Some(PLANNER)).await;
    }
    let updated = update_guarded(tx, &fast).await?;
    let exact: Vec<i64> = accounts
        .iter()
        .copied()
        .filter(|account| !updated.contains(account))
        .collect();
    if exact.is_empty() {
        return Ok(Vec::new());
    }
    let locking = match updated.is_empty() {
        true => Locking::Wait,
        false => Locking::NoWait,
    };
    match apply_exact(tx, messages, &exact, locking, None).await {
        Err(HandlerError::Db(e)) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            tx.batch_execute(ROLLBACK_TO_SAVEPOINT).await?;
            apply_exact(tx, messages, &accounts, Locking::Wait, None).await
        }
        other => other,
    }
}

/// The optimistic update, after the planner settings and a savepoint (sent in the same round
/// trip): applies each guard
/// whose account's balance lies in its range, in ascending account order (the guards are
/// sorted); returns the accounts it updated.
async fn update_guarded(
    tx: &Transaction<'_>,
    guards: &[Guard],
) -> Result<HashSet<i64>, HandlerError> {
    let column = |field: fn(&Guard) -> i64| guards.iter().map(field).collect::<Vec<i64>>();
    let (accounts, deltas) = (column(|g| g.account_id), column(|g| g.delta));
    let (needs, headrooms) = (column(|g| g.need), column(|g| g.headroom));
    let update = tx.prepare_cached(GUARDED_UPDATE).await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
        [&accounts, &deltas, &needs, &headrooms];
    let (_, rows) = futures::try_join!(
        tx.batch_execute(PLANNER_AND_SAVEPOINT),
        tx.query(&update, &params)
    )?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The exact path for `accounts` (ascending): lock them (creating missing ones), apply their
/// entries in partition order in memory, write the balances that changed. `prelude`, when the
/// transaction has not sent it yet, goes in the round trip of the first lock.
async fn apply_exact(
    tx: &Transaction<'_>,
    messages: &[Message<Entry>],
    accounts: &[i64],
    locking: Locking,
    prelude: Option<&str>,
) -> Result<Vec<Rejection>, HandlerError> {
    let before = lock_accounts(tx, accounts, locking, prelude).await?;
    let mut balances = before.clone();
    let exact: HashSet<i64> = accounts.iter().copied().collect();
    let entries = messages
        .iter()
        .map(|m| &m.payload)
        .enumerate()
        .filter(|(_, e)| exact.contains(&e.account_id));
    let rejected = apply_indexed(&mut balances, entries);

    let (ids, amounts): (Vec<i64>, Vec<i64>) = balances
        .iter()
        .filter(|(id, amount)| before.get(id) != Some(amount))
        .map(|(id, amount)| (*id, *amount))
        .unzip();
    if !ids.is_empty() {
        let write = tx.prepare_cached(WRITE_BALANCES).await?;
        tx.execute(&write, &[&ids, &amounts]).await?;
    }
    Ok(rejected)
}

/// Locks the accounts' rows in ascending order and returns their balances, creating missing
/// accounts at 0 first. One statement when every account exists; two more for new accounts.
async fn lock_accounts(
    tx: &Transaction<'_>,
    accounts: &[i64],
    locking: Locking,
    prelude: Option<&str>,
) -> Result<HashMap<i64, i64>, HandlerError> {
    let lock = tx
        .prepare_cached(match locking {
            Locking::Wait => LOCK_ACCOUNTS,
            Locking::NoWait => LOCK_ACCOUNTS_NOWAIT,
        })
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&accounts];
    let rows = match prelude {
        Some(sql) => futures::try_join!(tx.batch_execute(sql), tx.query(&lock, &params))?.1,
        None => tx.query(&lock, &params).await?,
    };
    let mut balances: HashMap<i64, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let missing: Vec<i64> = accounts
        .iter()
        .copied()
        .filter(|a| !balances.contains_key(a))
        .collect();
    if missing.is_empty() {
        return Ok(balances);
    }
    // A concurrent batch may create the same account: ON CONFLICT waits for it and skips, and
    // the second lock (a new statement, a new snapshot) then sees the committed row.
    let ensure = tx.prepare_cached(ENSURE_ACCOUNTS).await?;
    tx.execute(&ensure, &[&missing]).await?;
    let created = tx.query(&lock, &[&missing]).await?;
    balances.extend(
        created
            .iter()
            .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1))),
    );
    Ok(balances)
}

//! Concurrent inbox transactions: the inbox's primary key arbitrates between two sessions that
//! insert the same id, and sorted locks keep batches over the same accounts from deadlocking.

use crate::common;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use batch_inbox::internals::inbox::Inbox;
use batch_inbox::ledger::{Entry, Ledger};
use batch_inbox::HandlerError;
use batch_inbox::Message;
use batch_inbox::{Handler, Rejection, Transaction};
use common::*;
use deadpool_postgres::Pool;
use tokio::sync::oneshot;

/// The ledger, pausing after its work (just before COMMIT) until told to commit or roll back.
struct PausesBeforeCommit {
    paused: Mutex<Option<oneshot::Sender<()>>>,
    decision: Mutex<Option<oneshot::Receiver<bool>>>,
}

#[derive(Debug, thiserror::Error)]
#[error("told to roll back")]
struct RollBack;

impl Handler for PausesBeforeCommit {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        let rejected = Ledger.handle(tx, messages).await?;
        let paused = self.paused.lock().unwrap().take().expect("called once");
        let decision = self.decision.lock().unwrap().take().expect("called once");
        paused.send(()).unwrap();
        match decision.await {
            Ok(true) => Ok(rejected),
            _ => Err(HandlerError::Other(Box::new(RollBack))),
        }
    }
}

async fn sessions_waiting_on_a_lock(pool: &Pool) -> i64 {
    let c = pool.get().await.unwrap();
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Session A inserts id X and pauses before COMMIT; session B inserts X too and must wait on
/// A's row; A then commits or rolls back, and B skips or applies X accordingly.
async fn second_session_follows_the_first(name: &str, first_commits: bool) {
    let (_, pool) = fresh_db(name).await;
    let (paused_tx, paused_rx) = oneshot::channel();
    let (decide_tx, decide_rx) = oneshot::channel();
    let first = Inbox::new(
        pool.clone(),
        Arc::new(PausesBeforeCommit {
            paused: Mutex::new(Some(paused_tx)),
            decision: Mutex::new(Some(decide_rx)),
        }),
        "id",
    );
    let second = Inbox::new(pool.clone(), Arc::new(Ledger), "id");
    let x = uuid(1);

    let a_batch = first.decode(vec![ledger_record(0, &x, 7, 100)]);
    let a = tokio::spawn(async move { first.apply_batch("t", 0, &a_batch).await });
    paused_rx.await.expect("A reached its COMMIT");

    let b_batch = second.decode(vec![
        ledger_record(1, &x, 7, 100),
        ledger_record(2, &uuid(2), 7, 5),
    ]);
    let b = tokio::spawn(async move { second.apply_batch("t", 1, &b_batch).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while sessions_waiting_on_a_lock(&pool).await < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B never waited on A"
        );
        assert!(!b.is_finished(), "B finished while A held X uncommitted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    decide_tx.send(first_commits).unwrap();
    let a = a.await.unwrap();
    let b = b.await.unwrap().expect("B commits either way");
    assert_eq!(a.is_ok(), first_commits, "{a:?}");
    let t = tables(&pool).await;
    if first_commits {
        assert_eq!(
            (b.new, b.duplicates),
            (1, 1),
            "B skips X, applies its other id"
        );
        assert_eq!(t.inbox.iter().find(|r| r.0.to_string() == x).unwrap().2, 0);
    } else {
        assert_eq!((b.new, b.duplicates), (2, 0), "B applies X itself");
        assert_eq!(t.inbox.iter().find(|r| r.0.to_string() == x).unwrap().2, 1);
    }
    assert_eq!(t.balances, vec![(7, 105)], "X applied exactly once");
    assert_eq!(t.inbox.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_held_by_an_uncommitted_session_is_skipped_once_it_commits() {
    second_session_follows_the_first("pause_commit", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_held_by_an_uncommitted_session_is_applied_once_it_rolls_back() {
    second_session_follows_the_first("pause_rollback", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_the_same_accounts_in_opposite_orders_never_deadlock() {
    let (_, pool) = fresh_db("opposite_orders").await;
    let inbox = Arc::new(Inbox::new(pool.clone(), Arc::new(Ledger), "id"));
    let accounts: Vec<i64> = (1..=6).collect();
    let mut expected: BTreeMap<i64, i64> = BTreeMap::new();
    let mut applied: HashMap<String, (i64, i64)> = HashMap::new();
    let mut next = 0u32;
    for round in 0..1000i64 {
        // Two batches over the same accounts, one ascending and one descending, sharing two ids
        // (one of the two sessions applies each) and each with ids of its own.
        let shared = [uuid(next), uuid(next + 1)];
        next += 2;
        let mut sides = Vec::new();
        for order in [accounts.clone(), accounts.iter().rev().copied().collect()] {
            let mut records = Vec::new();
            for (i, account) in order.iter().enumerate() {
                let id = uuid(next);
                next += 1;
                records.push(ledger_record(
                    round * 10 + i as i64,
                    &id,
                    *account,
                    1 + round % 7,
                ));
                applied.insert(id, (*account, 1 + round % 7));
            }
            // The same two copies on both sides (accounts 1 and 6), whichever commits first.
            records.insert(
                0,
                ledger_record(round * 10 + 8, &shared[0], order[0].min(order[5]), 3),
            );
            records.push(ledger_record(
                round * 10 + 9,
                &shared[1],
                order[0].max(order[5]),
                4,
            ));
            sides.push(inbox.decode(records));
        }
        applied.insert(shared[0].clone(), (accounts[0], 3));
        applied.insert(shared[1].clone(), (accounts[5], 4));
        let (left, right) = (sides.remove(0), sides.remove(0));
        let (i1, i2) = (inbox.clone(), inbox.clone());
        let a = tokio::spawn(async move { i1.apply_batch("t", 0, &left).await });
        let b = tokio::spawn(async move { i2.apply_batch("t", 1, &right).await });
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        let (a, b) = match (a, b) {
            (Ok(a), Ok(b)) => (a, b),
            other => panic!("round {round}: {other:?}"),
        };
        assert_eq!(
            a.new + b.new,
            14,
            "round {round}: each shared id applied by one side"
        );
    }
    for (account, amount) in applied.values() {
        *expected.entry(*account).or_insert(0) += amount;
    }
    let t = tables(&pool).await;
    assert_eq!(t.balances, expected.into_iter().collect::<Vec<_>>());
    assert_eq!(t.inbox.len(), 1000 * 14);
}

/// One side's record of `round` for `account`: an amount no balance here can cover on the
/// accounts it debits, so that those accounts leave the optimistic update for the exact path.
fn mixed_record(offset: i64, id: &str, account: i64, debit: bool) -> batch_inbox::RawMessage {
    ledger_record(offset, id, account, if debit { -1_000_000_000 } else { 1 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_whose_optimistic_and_exact_accounts_cross_never_deadlock() {
    crossing("crossing_paths", 6, 300).await;
}

/// `rounds` of two concurrent batches over accounts `1..=n`, each crediting half of them and
/// refused (a debit of an empty account) on the other half, in opposite orders.
async fn crossing(name: &str, n: i64, rounds: i64) {
    let (_, pool) = fresh_db(name).await;
    let inbox = Arc::new(Inbox::new(pool.clone(), Arc::new(Ledger), "id"));
    let accounts: Vec<i64> = (1..=n).collect();
    let mut next = 0u32;
    let mut id = || {
        next += 1;
        uuid(next)
    };
    let create: Vec<_> = accounts
        .iter()
        .map(|a| ledger_record(*a, &id(), *a, 1))
        .collect();
    inbox
        .apply_batch("t", 0, &inbox.decode(create))
        .await
        .unwrap();
    for round in 0..rounds {
        // Side A credits the odd accounts and is refused on the even ones; side B the reverse,
        // in the opposite order. Each side's optimistic update locks the accounts the other
        // side's exact path needs.
        let mut sides = Vec::new();
        for (odd_credits, order) in [
            (true, accounts.clone()),
            (false, accounts.iter().rev().copied().collect()),
        ] {
            let records = order
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    let debit = (a % 2 == 1) != odd_credits;
                    mixed_record(n * 2 + round * n + i as i64, &id(), *a, debit)
                })
                .collect();
            sides.push(inbox.decode(records));
        }
        let (left, right) = (sides.remove(0), sides.remove(0));
        let (i1, i2) = (inbox.clone(), inbox.clone());
        let a = tokio::spawn(async move { i1.apply_batch("t", 0, &left).await });
        let b = tokio::spawn(async move { i2.apply_batch("t", 1, &right).await });
        match (a.await.unwrap(), b.await.unwrap()) {
            (Ok(a), Ok(b)) => {
                assert_eq!(
                    (a.rejected, b.rejected),
                    (n as u64 / 2, n as u64 / 2),
                    "round {round}"
                )
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    let t = tables(&pool).await;
    let expected: Vec<(i64, i64)> = accounts.iter().map(|a| (*a, 1 + rounds)).collect();
    assert_eq!(
        t.balances, expected,
        "every credit applied once, every debit refused"
    );
    assert_eq!(t.dead_letters.len() as i64, rounds * n);
}

/// A batch locks its accounts in ascending order whatever the plan its connection keeps: on 1,000
/// accounts written in descending order (so that heap order is the reverse of account order),
/// with generic plans forced, a batch crediting accounts 1 and 1,000 waits for account 1, which
/// another session holds, without holding account 1,000 meanwhile. (A hash join over
/// `balances` would lock in heap order: account 1,000 first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_locks_its_accounts_in_ascending_order_whatever_the_plan() {
    let (url, pool) = fresh_db("lock_order").await;
    pool.get()
        .await
        .unwrap()
        .batch_execute(
            "INSERT INTO balances SELECT a, 0 FROM generate_series(1000, 1, -1) a; ANALYZE balances",
        )
        .await
        .unwrap();
    let generic = format!("{url}?options=-c%20plan_cache_mode%3Dforce_generic_plan");
    let batch_pool = batch_inbox::db::connect(&generic, 1).await.unwrap();
    let inbox = Arc::new(Inbox::new(batch_pool, Arc::new(Ledger), "id"));

    let mut holder = pool.get().await.unwrap();
    let held = holder.transaction().await.unwrap();
    held.batch_execute("SELECT 1 FROM balances WHERE account_id = 1 FOR UPDATE")
        .await
        .unwrap();
    let records = vec![
        ledger_record(0, &uuid(1), 1, 5),
        ledger_record(1, &uuid(2), 1000, 7),
    ];
    let decoded = inbox.decode(records);
    let i = inbox.clone();
    let batch = tokio::spawn(async move { i.apply_batch("t", 0, &decoded).await });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while sessions_waiting_on_a_lock(&pool).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the batch never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut probe = pool.get().await.unwrap();
    let p = probe.transaction().await.unwrap();
    let free = p
        .query(
            "SELECT 1 FROM balances WHERE account_id = 1000 FOR UPDATE NOWAIT",
            &[],
        )
        .await;
    drop(p);
    assert!(
        free.is_ok(),
        "the waiting batch holds account 1000: it locked out of ascending order ({free:?})"
    );
    held.commit().await.unwrap();
    let outcome = batch.await.unwrap().unwrap();
    assert_eq!((outcome.new, outcome.rejected), (2, 0));
    let t = tables(&pool).await;
    let changed: Vec<(i64, i64)> = t.balances.into_iter().filter(|(_, b)| *b != 0).collect();
    assert_eq!(changed, vec![(1, 5), (1000, 7)]);
}

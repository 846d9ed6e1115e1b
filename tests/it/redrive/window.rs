//! A redrive removes only the inbox rows its dead letters wrote, without a broker: the parked
//! messages come from the library's inbox. An `outside_dedup_window` dead letter is a re-read of
//! a message the inbox already applied at the same position; re-driving it (the reason named)
//! keeps the original's inbox row, so the message ends as a duplicate, applied once. A handler's
//! rejection wrote its own inbox row: the redrive removes that one and applies the message.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use batch_inbox::internals::inbox::Inbox;
use batch_inbox::ledger::Ledger;
use batch_inbox::redrive::{self, RedriveReport, Selection};
use batch_inbox::{Header, RawMessage};
use bytes::Bytes;
use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::common::retention::{v7_at, DAY};
use crate::common::{fresh_db, tables};

/// The ledger entry `amount` to `account` at `offset` of partition 0 of topic `t`, id `id`.
fn entry(offset: i64, id: Uuid, account: i64, amount: i64) -> RawMessage {
    let value = format!(r#"{{"account_id":{account},"amount":{amount}}}"#);
    RawMessage {
        topic: Arc::from("t"),
        partition: 0,
        offset,
        timestamp_ms: None,
        key: None,
        payload: Some(Bytes::from(value)),
        headers: vec![Header {
            key: Bytes::from_static(b"id"),
            value: Some(Bytes::from(id.to_string())),
        }],
        header_error: None,
    }
}

/// Applies `records` as one batch through an inbox with dedup window `window`.
async fn apply(pool: &Pool, window: Option<Duration>, records: Vec<RawMessage>) {
    let inbox = Inbox::new(pool.clone(), Arc::new(Ledger), "id").with_dedup_window(window);
    let decoded = inbox.decode(records);
    inbox.apply_batch("t", 0, &decoded).await.unwrap();
}

/// Each dead letter's offset, reason and redrive outcome, in offset order.
async fn outcomes(pool: &Pool) -> Vec<(i64, String, Option<String>)> {
    let c = pool.get().await.unwrap();
    c.query(
        "SELECT \"offset\", reason, redrive_outcome FROM dead_letters ORDER BY 1",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn selection(reasons: &[&str]) -> Selection {
    let mut s = Selection::new("id");
    s.reasons = reasons.iter().map(|r| (*r).to_owned()).collect();
    s
}

#[tokio::test]
async fn redriving_an_outside_window_reread_keeps_the_original_and_applies_it_once() {
    let (_, pool) = fresh_db("redrive_window_reread").await;
    let id = v7_at(SystemTime::now() - 30 * DAY);
    // The original application, without a guard (the window was not set yet)…
    apply(&pool, None, vec![entry(3, id, 1, 5)]).await;
    // …then the same record read again (a replay) under a 7-day window: parked.
    apply(&pool, Some(7 * DAY), vec![entry(3, id, 1, 5)]).await;
    let before = tables(&pool).await;
    assert_eq!(before.balances, [(1, 5)]);
    assert_eq!(before.inbox, [(id, 0, 3)]);
    assert_eq!(
        outcomes(&pool).await,
        [(3, "outside_dedup_window".to_owned(), None)]
    );

    let report = redrive::redrive(&pool, &Ledger, &selection(&["outside_dedup_window"]))
        .await
        .unwrap();

    assert_eq!(
        report,
        RedriveReport {
            duplicate: 1,
            ..RedriveReport::default()
        }
    );
    let after = tables(&pool).await;
    assert_eq!(after.balances, [(1, 5)], "applied once, not twice");
    assert_eq!(after.inbox, [(id, 0, 3)], "the original's row kept");
    assert_eq!(
        outcomes(&pool).await,
        [(
            3,
            "outside_dedup_window".to_owned(),
            Some("duplicate".to_owned())
        )]
    );
}

#[tokio::test]
async fn redriving_a_rejection_removes_its_own_inbox_row_and_applies_it() {
    let (_, pool) = fresh_db("redrive_window_rejection").await;
    let now = SystemTime::now();
    let (debit, deposit) = (v7_at(now - Duration::from_secs(1)), v7_at(now));
    // A debit of an empty account: refused (insufficient_funds), its id in the inbox.
    apply(&pool, None, vec![entry(0, debit, 1, -4)]).await;
    assert_eq!(tables(&pool).await.inbox, [(debit, 0, 0)]);
    apply(&pool, None, vec![entry(1, deposit, 1, 10)]).await;

    let report = redrive::redrive(&pool, &Ledger, &selection(&[]))
        .await
        .unwrap();

    assert_eq!(
        report,
        RedriveReport {
            applied: 1,
            ..RedriveReport::default()
        }
    );
    let after = tables(&pool).await;
    assert_eq!(after.balances, [(1, 6)]);
    assert_eq!(after.inbox, [(debit, 0, 0), (deposit, 0, 1)]);
    assert_eq!(
        outcomes(&pool).await,
        [(
            0,
            "insufficient_funds".to_owned(),
            Some("applied".to_owned())
        )]
    );
}

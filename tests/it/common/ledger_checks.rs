//! The input and the checks of the tests that run the binary against a broker process (`amqp`,
//! `nats`): generated ledger records, the database against the model, waits on its tables with
//! deadlines, a stored position, `/readyz` and the metrics. Used as `common::ledger_checks`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use batch_inbox_tools::generate::{generate, Expected, GeneratorSettings, Record};
use batch_inbox_tools::verify::{differences, observe, Observed};
use deadpool_postgres::Pool;

use super::{group, http};

/// Generated records with duplicates, bad input and overdrafts, over 200 accounts, and the
/// state applying them must leave.
pub fn input(messages: u64, seed: u64) -> (Vec<Record>, Expected) {
    generate(GeneratorSettings {
        messages,
        accounts: 200,
        duplicate_ratio: 0.15,
        bad_ratio: 0.02,
        seed,
        ..GeneratorSettings::default()
    })
}

/// The ledger's tables read now.
pub async fn observed(pool: &Pool) -> Observed {
    observe(&**pool.get().await.unwrap()).await.unwrap()
}

/// The database is the model's: every id once, every balance, every dead letter.
pub async fn assert_exact(pool: &Pool, expected: &Expected) {
    assert_eq!(
        differences(&observed(pool).await, expected),
        Vec::<String>::new()
    );
}

/// The model's state after every record was published a second time, as new messages (a
/// publisher that resends all): no id applied again, the balances unchanged, and each bad
/// record dead-lettered once more, except an overdraft (its id is in the inbox: skipped).
pub async fn assert_exact_after_a_republish(pool: &Pool, expected: &Expected) {
    let again = observed(pool).await;
    assert_eq!(again.inbox, expected.new);
    assert_eq!(again.balances, expected.balances);
    for (reason, n) in &expected.dead_letters {
        let twice = match reason.as_str() {
            "insufficient_funds" => *n,
            _ => 2 * n,
        };
        assert_eq!(again.dead_letters.get(reason), Some(&twice), "{reason}");
    }
}

/// Waits until the inbox holds at least `n` rows (at most 60 s).
pub async fn wait_for_rows(pool: &Pool, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows = group::inbox_rows(pool).await;
        if rows >= n {
            return;
        }
        assert!(Instant::now() < deadline, "inbox stuck at {rows} of {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `check` accepts the ledger's tables (at most 120 s); its `Err` says what is not
/// there yet, and is the failure's message when time runs out.
pub async fn wait_for_state(pool: &Pool, check: impl Fn(&Observed) -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match check(&observed(pool).await) {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "not the model's state: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the database is the model's (at most 120 s).
pub async fn wait_for_exact(pool: &Pool, expected: &Expected) {
    wait_for_state(pool, |o| {
        let diffs = differences(o, expected);
        match diffs.is_empty() {
            true => Ok(()),
            false => Err(format!("{diffs:?}")),
        }
    })
    .await
}

/// Rows in `dead_letters`.
pub async fn dead_letter_rows(pool: &Pool) -> i64 {
    let client = pool.get().await.unwrap();
    let row = client
        .query_one("SELECT count(*) FROM dead_letters", &[])
        .await
        .unwrap();
    row.get(0)
}

/// The position the database holds for `topic` (a queue, a stream), partition 0, of reader
/// `group`; `None` when it holds none.
pub async fn stored_position(pool: &Pool, group: &str, topic: &str) -> Option<i64> {
    pool.get()
        .await
        .unwrap()
        .query_opt(
            "SELECT next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2 \
             AND partition = 0",
            &[&group, &topic],
        )
        .await
        .unwrap()
        .map(|row| row.get(0))
}

/// Polls `/readyz` until it answers `status` (at most 60 s); returns the body.
pub async fn readyz_becomes(addr: SocketAddr, status: u16) -> String {
    let what = format!("/readyz to answer {status}");
    http::poll(Duration::from_secs(60), &what, || async {
        let (s, body) = http::get(addr, "/readyz").await;
        (s == status).then_some(body)
    })
    .await
}

/// The sum of the samples in an exposition whose name starts with `name` (0 when none does).
pub fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sample `name` (exactly) of the metrics the processor at `addr` serves; the listener must
/// answer and the sample be there.
pub async fn served_sample(addr: SocketAddr, name: &str) -> f64 {
    let (status, body) = http::get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    *http::samples(&body)
        .get(name)
        .unwrap_or_else(|| panic!("no {name}: {body}"))
}

//! `dead-letters redrive` and `dead-letters list` against the real PostgreSQL and a broker
//! (`KAFKA_BROKERS`): the pipeline parks messages (a CHECK constraint refuses them, the
//! dedup-window guard holds them back), the cause is fixed, and a redrive applies each parked
//! message exactly once, marks its dead letter and deletes none; a second redrive and a full
//! replay by a new consumer group change nothing. Two redrives at once apply each message once;
//! a redrive killed midway and run again too (module `crash`, failpoints builds). `list`: the
//! listing; `sql`: the SQL handler's input on a redrive; `window`: which inbox rows a redrive
//! removes, without a broker.

use std::time::Duration;

use batch_inbox::ledger::Ledger;
use batch_inbox::redrive::{self, RedriveReport, Selection};
use batch_inbox::Mode;
use deadpool_postgres::Pool;

use crate::common::child::{Finished, Running};
use crate::common::raw_producer::RawRecord;
use crate::common::scenario::{Scenario, World};
use crate::common::{self, uuid};
use crate::sql_handler::record;

#[cfg(feature = "failpoints")]
mod crash;
mod list;
mod sql;
mod window;

/// The CHECK constraint that refuses account 7 (the ledger creates an account on first use).
pub(crate) const NO_SEVEN: &str =
    "ALTER TABLE balances ADD CONSTRAINT no_seven CHECK (account_id <> 7)";

pub(crate) async fn exec(pool: &Pool, sql: &str) {
    pool.get().await.unwrap().batch_execute(sql).await.unwrap();
}

/// A ledger entry of partition 0 with id `id`.
pub(crate) fn entry(id: &str, account: i64, amount: i64) -> RawRecord {
    RawRecord {
        headers: vec![(b"id".to_vec(), Some(id.as_bytes().to_vec()))],
        ..record(
            0,
            0,
            Some(account.to_string().as_bytes()),
            &format!(r#"{{"account_id":{account},"amount":{amount}}}"#),
        )
    }
}

/// Runs the ledger pipeline over the world's topic for `group` to its end.
pub(crate) async fn pipeline(
    world: &World,
    group: &str,
    dedup_window: Option<Duration>,
) -> batch_inbox::StatsSnapshot {
    let mut config = common::config(world.settings(group), Mode::Batched, 50);
    config.dedup_window = dedup_window;
    world.run_library(config).await
}

/// `batch-inbox dead-letters redrive --database-url URL extra…`, at most 60 s.
pub(crate) async fn redrive_bin(url: &str, extra: &[&str], env: &[(&str, &str)]) -> Finished {
    let mut args = vec!["dead-letters", "redrive", "--database-url", url];
    args.extend(extra);
    Running::spawn(&args, env)
        .wait(Duration::from_secs(60))
        .await
}

/// The report line of a successful redrive.
pub(crate) fn report(run: &Finished) -> RedriveReport {
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let words: Vec<&str> = run.stdout.split_whitespace().collect();
    let after = |label: &[&str]| -> u64 {
        let i = words
            .windows(label.len())
            .position(|w| w == label)
            .unwrap_or_else(|| panic!("{label:?} in {}", run.stdout));
        let n = words[i + label.len()].trim_end_matches(';');
        n.parse().unwrap()
    };
    RedriveReport {
        applied: after(&["applied"]),
        duplicate: after(&["duplicate"]),
        rejected: after(&["rejected"]),
        failed_again: after(&["failed", "again"]),
        failed_decoding: after(&["decoding", "again"]),
    }
}

pub(crate) fn counts(applied: u64, duplicate: u64, failed_again: u64) -> RedriveReport {
    RedriveReport {
        applied,
        duplicate,
        failed_again,
        ..RedriveReport::default()
    }
}

/// `(partition, offset, message_id, reason, redrive_outcome, redrive_attempts, re-driven,
/// has a Kafka timestamp)` of a dead letter.
pub(crate) type Letter = (
    i32,
    i64,
    Option<String>,
    String,
    Option<String>,
    i32,
    bool,
    bool,
);

/// Every table: inbox, balances, and the dead letters with their redrive state.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) tables: common::Tables,
    pub(crate) letters: Vec<Letter>,
}

pub(crate) async fn state(pool: &Pool) -> State {
    let c = pool.get().await.unwrap();
    let rows = c
        .query(
            "SELECT partition, \"offset\", message_id, reason, redrive_outcome, redrive_attempts,
                    redriven_at IS NOT NULL, timestamp_ms IS NOT NULL
             FROM dead_letters ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap();
    let letters = rows
        .iter()
        .map(|r| {
            let g = |i| r.get::<_, bool>(i);
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                g(6),
                g(7),
            )
        })
        .collect();
    State {
        tables: common::tables(pool).await,
        letters,
    }
}

pub(crate) fn letter(
    offset: i64,
    id: &str,
    reason: &str,
    outcome: Option<&str>,
    attempts: i32,
) -> Letter {
    let outcome = outcome.map(str::to_owned);
    let redriven = outcome.is_some();
    (
        0,
        offset,
        Some(id.to_owned()),
        reason.to_owned(),
        outcome,
        attempts,
        redriven,
        true,
    )
}

/// 12 ledger entries (account 7 every third, refused by [`NO_SEVEN`]), a value that is not
/// JSON, and a copy of the first refused entry.
fn ledger_records() -> Vec<RawRecord> {
    let mut records: Vec<RawRecord> = (0..12)
        .map(|i| {
            let account = if i % 3 == 1 { 7 } else { 5 + i % 2 };
            entry(&uuid(i as u32 + 1), account, 10 + i)
        })
        .collect();
    records.push(RawRecord {
        value: Some(b"not json".to_vec()),
        ..entry(&uuid(100), 5, 1)
    });
    records.push(entry(&uuid(2), 7, 11));
    records
}

fn refused_offsets() -> [i64; 4] {
    [1, 4, 7, 10]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_messages_are_applied_once_after_the_constraint_is_dropped() {
    let world = Scenario::new("redrive_check")
        .records(ledger_records())
        .build()
        .await;
    let (url, pool) = world.db();
    exec(&pool, NO_SEVEN).await;
    pipeline(&world, "g", None).await;
    let parked = |attempts| -> Vec<Letter> {
        let mut l: Vec<Letter> = refused_offsets()
            .iter()
            .map(|&o| letter(o, &uuid(o as u32 + 1), "handler_error", None, attempts))
            .collect();
        l.push(letter(12, &uuid(100), "invalid_payload", None, 0));
        l
    };
    let before = state(&pool).await;
    assert_eq!(before.tables.balances, vec![(5, 56), (6, 68)]);
    assert_eq!(before.letters, parked(0));
    let inbox: Vec<_> = (0..12)
        .map(|i| (uuid::Uuid::parse_str(&uuid(i + 1)).unwrap(), 0, i as i64))
        .collect();
    assert_eq!(before.tables.inbox, inbox);

    // The cause is still there: each fails again alone, stays parked with the new error.
    let again = redrive_bin(&url, &[], &[]).await;
    assert_eq!(report(&again), counts(0, 0, 4));
    let after_failure = state(&pool).await;
    assert_eq!(after_failure.tables, before.tables);
    assert_eq!(after_failure.letters, parked(1));
    let c = pool.get().await.unwrap();
    let detail: String = c
        .query_one("SELECT detail FROM dead_letters WHERE \"offset\" = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert!(detail.contains("no_seven"), "{detail}");

    // The environment's fault stops the command and changes nothing.
    exec(&pool, "ALTER TABLE balances RENAME TO balances_away").await;
    let stopped = redrive_bin(&url, &[], &[]).await;
    assert_eq!(stopped.code, Some(1), "{}", stopped.stdout);
    assert!(
        stopped
            .stderr
            .contains("redrive stopped at the dead letters from")
            && stopped.stderr.contains("balances"),
        "{}",
        stopped.stderr
    );
    exec(&pool, "ALTER TABLE balances_away RENAME TO balances").await;
    assert_eq!(state(&pool).await, after_failure);

    exec(&pool, "ALTER TABLE balances DROP CONSTRAINT no_seven").await;
    let applied = redrive_bin(&url, &[], &[]).await;
    assert_eq!(report(&applied), counts(4, 0, 0));
    let done = state(&pool).await;
    assert_eq!(done.tables.balances, vec![(5, 56), (6, 68), (7, 62)]);
    assert_eq!(done.tables.inbox, inbox, "same ids, same positions");
    let mut marked: Vec<Letter> = refused_offsets()
        .iter()
        .map(|&o| letter(o, &uuid(o as u32 + 1), "handler_error", Some("applied"), 2))
        .collect();
    marked.push(letter(12, &uuid(100), "invalid_payload", None, 0));
    assert_eq!(done.letters, marked);

    let second = redrive_bin(&url, &[], &[]).await;
    assert_eq!(report(&second), RedriveReport::default());
    assert_eq!(state(&pool).await, done);
    pipeline(&world, "replay", None).await;
    assert_eq!(state(&pool).await, done);
}

/// A UUIDv7 created `days` ago (its counter `n`).
fn old_v7(days: u64, n: u8) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let ms = (now.as_millis() as u64 - days * 86_400_000).to_be_bytes();
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&ms[2..]);
    b[6] = 0x70;
    b[8] = 0x80;
    b[15] = n;
    uuid::Uuid::from_bytes(b).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_applied_meanwhile_under_another_position_is_a_duplicate() {
    let (x, y) = (old_v7(2, 1), old_v7(2, 2));
    let world = Scenario::new("redrive_duplicate")
        .records([entry(&x, 1, 5), entry(&y, 1, 7)])
        .build()
        .await;
    let (url, pool) = world.db();
    let day = Some(Duration::from_secs(86_400));
    pipeline(&world, "g", day).await;
    // Held back by the guard: not selected by default.
    assert_eq!(
        report(&redrive_bin(&url, &[], &[]).await),
        RedriveReport::default()
    );
    // A copy of x arrives later and is applied (no guard on this run).
    world.produce(&[entry(&x, 1, 5)]);
    pipeline(&world, "g", None).await;
    assert_eq!(state(&pool).await.tables.balances, vec![(1, 5)]);

    let run = redrive_bin(&url, &["--reason", "outside_dedup_window"], &[]).await;
    assert_eq!(report(&run), counts(1, 1, 0));
    let s = state(&pool).await;
    assert_eq!(s.tables.balances, vec![(1, 12)]);
    let id = |t: &str| uuid::Uuid::parse_str(t).unwrap();
    let mut inbox = vec![(id(&x), 0, 2), (id(&y), 0, 1)];
    inbox.sort();
    assert_eq!(
        s.tables.inbox, inbox,
        "x keeps the row of the copy that applied it"
    );
    let reason = "outside_dedup_window";
    assert_eq!(
        s.letters,
        vec![
            letter(0, &x, reason, Some("duplicate"), 1),
            letter(1, &y, reason, Some("applied"), 1),
        ]
    );
}

/// Database and topic `name`: `n` entries, every other one for account 7 (refused while
/// [`NO_SEVEN`] holds), parked by the pipeline; returns the world and the refused ones' total.
pub(crate) async fn parked_sevens(name: &str, n: i64) -> (World, i64) {
    let records: Vec<RawRecord> = (0..n)
        .map(|i| entry(&uuid(i as u32 + 1), if i % 2 == 0 { 7 } else { 8 }, i + 1))
        .collect();
    let world = Scenario::new(name).records(records).build().await;
    let pool = &world.pool;
    exec(pool, NO_SEVEN).await;
    pipeline(&world, "g", None).await;
    let parked = crate::sql_handler::count(pool, "SELECT count(*) FROM dead_letters").await;
    assert_eq!(parked, (n + 1) / 2);
    exec(pool, "ALTER TABLE balances DROP CONSTRAINT no_seven").await;
    (world, (0..n).filter(|i| i % 2 == 0).map(|i| i + 1).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_redrives_at_once_apply_each_message_once() {
    let (world, total) = parked_sevens("redrive_concurrent", 120).await;
    let pool = world.pool.clone();
    let other_url = common::db_url(&common::db_name("redrive_concurrent"));
    let other = batch_inbox::db::connect(&other_url, 2).await.unwrap();
    let mut selection = Selection::new("id");
    selection.batch_size = 5.try_into().unwrap();
    let (a, b) = tokio::join!(
        redrive::redrive(&pool, &Ledger, &selection),
        redrive::redrive(&other, &Ledger, &selection)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!((a.applied + b.applied, a.duplicate + b.duplicate), (60, 0));
    let s = state(&pool).await;
    assert!(
        s.tables.balances.contains(&(7, total)),
        "{:?}",
        s.tables.balances
    );
    assert!(s
        .letters
        .iter()
        .all(|l| l.4.as_deref() == Some("applied") && l.5 == 1));
    assert_eq!(s.letters.len(), 60);
}

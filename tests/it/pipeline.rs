//! The pipeline end to end: mock Kafka cluster → processor → real PostgreSQL.
//! Each test has its own database, cluster and topic.

use crate::common;
use crate::common::group;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use batch_inbox::ledger::{Entry, Ledger};
use batch_inbox::HandlerError;
use batch_inbox::Message;
use batch_inbox::{Handler, Mode, Rejection, Transaction};
use batch_inbox_tools::generate::GeneratorSettings;
use common::scenario::Scenario;
use common::*;
use tokio::sync::oneshot;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_across_batches_are_applied_once() {
    let world = Scenario::new("dup_across")
        .mock()
        .entries((0..30).map(|i| (0, uuid(i), 1, 10)))
        // The same ids again, 30 records later: other batches of 10.
        .entries((0..30).map(|i| (0, uuid(i), 1, 10)))
        .build()
        .await;
    let pool = world.pool.clone();
    let stats = drain(config(world.settings("g"), Mode::Batched, 10), &pool).await;
    assert_eq!((stats.records, stats.new, stats.duplicates), (60, 30, 30));
    let t = tables(&pool).await;
    assert_eq!(t.balances, vec![(1, 300)]);
    assert_eq!(t.inbox.len(), 30);
    assert!(
        t.inbox.iter().all(|(_, _, offset)| *offset < 30),
        "first copies recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_inside_one_batch_are_applied_once() {
    // a, a, b, a, b: one batch of 5. The test is about a batch's shape, so it batches with a
    // linger that only the batch's size (5) or the partition's end can cut short.
    let world = Scenario::new("dup_inside")
        .mock()
        .entries([1, 1, 2, 1, 2].map(|i| (0, uuid(i), 7, i as i64 * 100)))
        .build()
        .await;
    let pool = world.pool.clone();
    let cfg = with_linger(
        config(world.settings("g"), Mode::Batched, 5),
        std::time::Duration::from_secs(60),
    );
    let stats = drain(cfg, &pool).await;
    assert_eq!(stats.transactions, 1, "one batch");
    assert_eq!((stats.new, stats.duplicates), (2, 3));
    let t = tables(&pool).await;
    assert_eq!(t.balances, vec![(7, 300)]);
    let offsets: Vec<i64> = t.inbox.iter().map(|r| r.2).collect();
    assert_eq!(offsets, vec![0, 2], "the first occurrence of each id wins");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_after_restart_without_offset_commit_applies_nothing_twice() {
    let world = Scenario::new("redelivery")
        .mock()
        .partitions(4)
        .generated(GeneratorSettings {
            messages: 3_000,
            accounts: 50,
            ..GeneratorSettings::default()
        })
        .build()
        .await;
    let (pool, kafka) = (world.pool.clone(), world.kafka());
    let first = drain(config(kafka.settings("first"), Mode::Batched, 200), &pool).await;
    assert_eq!(first.records, 3_000);
    let before = tables(&pool).await;
    // A member of a group with no committed offset gets everything again, exactly as a
    // processor restarted after a crash that lost its offset commit.
    let again = drain(config(kafka.settings("second"), Mode::Batched, 200), &pool).await;
    assert_eq!(again.records, 3_000);
    assert_eq!(again.new, 0, "every RETURNING of the replay is empty");
    assert_eq!(
        again.dead_letters_written, 0,
        "dead letters are not written twice"
    );
    assert_eq!(tables(&pool).await, before);
    world.assert_exact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_mean_a_restarted_member_reads_nothing_again() {
    let world = Scenario::new("restart_same_group")
        .mock()
        .partitions(2)
        .entries((0..100).map(|i| ((i % 2) as i32, uuid(i), i as i64 % 5, 1)))
        .build()
        .await;
    let (pool, kafka) = (world.pool.clone(), world.kafka());
    // librdkafka's own commits off (allowed with offsets in the database): Kafka's committed
    // offsets are then the processor's own commits only (before its end-of-topic check, at
    // shutdown). The restart below starts from the database's offsets whatever Kafka holds, so
    // Kafka's are read from the broker.
    let cfg = || {
        let mut settings = kafka.settings("g");
        let no_auto_commit = ("enable.auto.commit".to_owned(), "false".to_owned());
        settings.overrides.push(no_auto_commit);
        config(settings, Mode::Batched, 30)
    };
    let reader = group::OffsetReader::new(&kafka.brokers, "g", &kafka.topic, 2);
    let first = drain(cfg(), &pool).await;
    assert_eq!(first.records, 100);
    assert_eq!(
        reader.committed(),
        Some(vec![50, 50]),
        "the first member committed to Kafka"
    );
    kafka.send_entry(0, &uuid(1000), 1, 1).await;
    let second = drain(cfg(), &pool).await;
    assert_eq!(
        second.records, 1,
        "only the record produced after the commit"
    );
    assert_eq!(second.new, 1);
    assert_eq!(reader.committed(), Some(vec![51, 50]));
    assert_eq!(group::db_offsets(&pool, "g", 2).await, vec![51, 50]);
}

/// The ledger, holding its first transaction that has new messages open (ids inserted, balances
/// written, no COMMIT) until told to go on; it hands over that transaction's ids.
struct HoldsFirstBatch {
    hold: Mutex<Option<Hold>>,
}

/// Where the held transaction's ids go, and the signal to go on.
type Hold = (oneshot::Sender<Vec<Uuid>>, oneshot::Receiver<()>);

impl Handler for HoldsFirstBatch {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        let rejected = Ledger.handle(tx, messages).await?;
        let hold = match messages.is_empty() {
            true => None,
            false => self.hold.lock().unwrap().take(),
        };
        if let Some((held, go)) = hold {
            held.send(messages.iter().map(|m| m.id).collect()).unwrap();
            go.await.unwrap();
        }
        Ok(rejected)
    }
}

/// The ledger, recording the ids it is handed (new to the inbox in its transaction).
#[derive(Default)]
struct RecordsIds(Mutex<Vec<Uuid>>);

impl Handler for RecordsIds {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        self.0.lock().unwrap().extend(messages.iter().map(|m| m.id));
        Ledger.handle(tx, messages).await
    }

    async fn handle_one(
        &self,
        tx: &Transaction<'_>,
        message: &Message<Entry>,
    ) -> Result<Option<Rejection>, HandlerError> {
        self.0.lock().unwrap().push(message.id);
        Ledger.handle_one(tx, message).await
    }
}

/// Sessions of application `waiting` that wait on a lock in the inbox's INSERT, held by a
/// session of application `holding`.
async fn inbox_inserts_blocked(
    pool: &deadpool_postgres::Pool,
    waiting: &str,
    holding: &str,
) -> i64 {
    let c = pool.get().await.unwrap();
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity w
         WHERE w.datname = current_database() AND w.application_name = $1
           AND w.wait_event_type = 'Lock' AND w.query LIKE '%INSERT INTO inbox %'
           AND EXISTS (SELECT 1 FROM pg_stat_activity h
                       WHERE h.pid = ANY (pg_blocking_pids(w.pid)) AND h.application_name = $2)",
        &[&waiting, &holding],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processors_handed_the_same_messages_apply_each_once() {
    let world = Scenario::new("two_processors")
        .mock()
        .partitions(4)
        .generated(GeneratorSettings {
            messages: 4_000,
            accounts: 30,
            ..GeneratorSettings::default()
        })
        .build()
        .await;
    let ((url, pool), kafka) = (world.db(), world.kafka());
    let expected = world.expected.as_ref().unwrap();
    // Two groups: both processors receive every message, on one database, each with a pool of
    // its own whose sessions are named after it.
    let named = |name: &str| format!("{url}?application_name={name}");
    let pool_a = batch_inbox::db::connect(&named("processor_a"), 8)
        .await
        .unwrap();
    let pool_b = batch_inbox::db::connect(&named("processor_b"), 8)
        .await
        .unwrap();
    let (hold, held) = oneshot::channel();
    let (go, went) = oneshot::channel();
    let a_handler = Arc::new(HoldsFirstBatch {
        hold: Mutex::new(Some((hold, went))),
    });
    let b_handler = Arc::new(RecordsIds::default());

    // A holds its first transaction with new ids uncommitted; B, started then, reads the same
    // partitions from their start and reaches copies that A holds: its inbox INSERT must wait.
    let a = tokio::spawn({
        let cfg = config(kafka.settings("a"), Mode::Batched, 100);
        async move { drain_with(cfg, &pool_a, a_handler).await }
    });
    let held = tokio::time::timeout(std::time::Duration::from_secs(60), held)
        .await
        .expect("A reached a batch with new ids within 60 s")
        .unwrap();
    let b = tokio::spawn({
        let (cfg, handler) = (
            config(kafka.settings("b"), Mode::Batched, 100),
            b_handler.clone(),
        );
        async move { drain_with(cfg, &pool_b, handler).await }
    });
    group::wait_for(
        "B's inbox INSERT to wait on a copy that A holds",
        60,
        || async { inbox_inserts_blocked(&pool, "processor_b", "processor_a").await > 0 },
    )
    .await;
    assert!(!a.is_finished(), "A's held transaction is still open");
    go.send(()).unwrap();
    let (a, b) = (a.await.unwrap(), b.await.unwrap());

    // B's waiting transaction went on once A committed, skipping A's ids as duplicates: no error,
    // no retry, no bisection, and none of A's held ids handed to B's handler.
    assert_eq!((b.retries, b.poisoned, b.poison_failures), (0, 0, 0));
    let applied_by_b: HashSet<Uuid> = b_handler.0.lock().unwrap().iter().copied().collect();
    assert!(
        held.iter().all(|id| !applied_by_b.contains(id)),
        "B applied an id that A held"
    );
    assert_eq!(applied_by_b.len() as u64, b.new);
    assert_eq!(a.records + b.records, 8_000);
    assert_eq!(
        a.new + b.new,
        expected.new,
        "each id applied by exactly one of them"
    );
    let inbox: HashSet<Uuid> = tables(&pool).await.inbox.iter().map(|r| r.0).collect();
    assert!(
        held.iter().all(|id| inbox.contains(id)),
        "A's held ids committed"
    );
    world.assert_exact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_modes_leave_identical_state() {
    let input = GeneratorSettings {
        messages: 2_000,
        accounts: 20,
        duplicate_ratio: 0.2,
        bad_ratio: 0.05,
        debit_ratio: 0.5,
        id_version: 4,
        seed: 42,
        ..GeneratorSettings::default()
    };
    let world = Scenario::new("modes_batched")
        .topic("modes")
        .mock()
        .partitions(3)
        .generated(input)
        .build()
        .await;
    let kafka = world.kafka();

    let (_, batched) = world.db();
    let (_, per_message) = world.database("modes_per_message").await;
    let b = drain(
        config(kafka.settings("batched"), Mode::Batched, 500),
        &batched,
    )
    .await;
    let p = drain(
        config(kafka.settings("per-message"), Mode::PerMessage, 500),
        &per_message,
    )
    .await;

    assert_eq!(p.transactions, 2_000, "one transaction per message");
    assert!(
        b.transactions < 50,
        "{} batched transactions",
        b.transactions
    );
    assert_eq!(
        (b.new, b.duplicates, b.rejected, b.invalid),
        (p.new, p.duplicates, p.rejected, p.invalid)
    );
    let tb = tables(&batched).await;
    assert_eq!(tb, tables(&per_message).await);
    assert!(tb.dead_letters.iter().any(|d| d.3 == "insufficient_funds"));
    assert!(tb.dead_letters.iter().any(|d| d.3 == "invalid_payload"));
    world.assert_exact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insufficient_funds_respects_per_account_order() {
    for mode in [Mode::Batched, Mode::PerMessage] {
        let name = format!("order_{mode:?}").to_lowercase();
        let world = Scenario::new(&name)
            .topic(&name)
            .mock()
            // account 1: +10, -15 (refused: 10 < 15), +10, -15 (accepted: 20 - 15 = 5)
            .entries(
                (0..4)
                    .zip([10, -15, 10, -15])
                    .map(|(i, a)| (0, uuid(i), 1, a)),
            )
            // account 2: a first debit is refused, and still creates the account at 0
            .entry(0, &uuid(10), 2, -1)
            .build()
            .await;
        let pool = world.pool.clone();
        let stats = drain(config(world.settings("g"), mode, 100), &pool).await;
        assert_eq!((stats.new, stats.rejected), (5, 2), "{mode:?}");
        let t = tables(&pool).await;
        assert_eq!(t.balances, vec![(1, 5), (2, 0)], "{mode:?}");
        let refused: Vec<(i64, &str)> =
            t.dead_letters.iter().map(|d| (d.1, d.3.as_str())).collect();
        assert_eq!(
            refused,
            vec![(1, "insufficient_funds"), (4, "insufficient_funds")]
        );
        assert_eq!(
            t.inbox.len(),
            5,
            "refused messages stay in the inbox: never re-evaluated"
        );
    }
}

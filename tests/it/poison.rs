//! A message the handler fails on for a non-transient reason (a poison message) is isolated by
//! bisecting its batch: exactly that message is dead-lettered with the handler's error, every
//! other message is applied, the partition moves on, and it costs about 2·log2(n) transactions.

use crate::common;
use crate::common::http;
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use batch_inbox::internals::inbox::Inbox;
use batch_inbox::internals::worker::{Input, PartitionWorker};
use batch_inbox::ledger::{Entry, Ledger};
use batch_inbox::HandlerError;
use batch_inbox::{Handler, Mode, Rejection, Transaction};
use batch_inbox::{Header, Message, RawMessage};
use batch_inbox::{Stats, StatsSnapshot};
use bytes::Bytes;
use common::*;
use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The ledger, except that any transaction holding a poison id fails with a division by zero
/// (SQLSTATE 22012: not transient).
struct PoisonLedger {
    poison: HashSet<Uuid>,
}

impl Handler for PoisonLedger {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        if messages.iter().any(|m| self.poison.contains(&m.id)) {
            tx.batch_execute("SELECT 1 / 0").await?;
        }
        Ledger.handle(tx, messages).await
    }
}

/// Record `offset`: a credit of `offset + 1` to account `offset % 5`, id `uuid(offset)`; or,
/// when `bad`, a value that is not JSON.
fn record(offset: i64, bad: bool) -> RawMessage {
    let value = match bad {
        true => "not json".to_owned(),
        false => format!(r#"{{"account_id":{},"amount":{}}}"#, offset % 5, offset + 1),
    };
    RawMessage {
        topic: Arc::from("t"),
        partition: 0,
        offset,
        timestamp_ms: None,
        key: None,
        payload: Some(Bytes::from(value)),
        headers: vec![Header {
            key: "id".into(),
            value: Some(Bytes::from(uuid(offset as u32))),
        }],
        header_error: None,
    }
}

fn id(offset: i64) -> Uuid {
    Uuid::parse_str(&uuid(offset as u32)).unwrap()
}

/// Runs one worker over records `0..n` (one batch of `n` when batched), with the given poison
/// and undecodable offsets. Returns its stats and the offsets it stored.
async fn run(
    pool: &Pool,
    mode: Mode,
    n: i64,
    poison: &[i64],
    bad: &[i64],
) -> (StatsSnapshot, Vec<i64>) {
    let handler = PoisonLedger {
        poison: poison.iter().map(|o| id(*o)).collect(),
    };
    run_with(pool, handler, mode, n, bad).await
}

/// [`run`] with any handler of ledger entries.
async fn run_with<H: Handler<Payload = Entry>>(
    pool: &Pool,
    handler: H,
    mode: Mode,
    n: i64,
    bad: &[i64],
) -> (StatsSnapshot, Vec<i64>) {
    let handler = Arc::new(handler);
    let sink = Arc::new(Recorded::default());
    let stats = Arc::new(Stats::default());
    let settings = worker_settings(mode, n as usize, 1usize << 20);
    let inbox = Inbox::new(pool.clone(), handler, "id").with_offsets_in_db(Some("g"));
    let worker = PartitionWorker::new(
        Arc::from("t"),
        0,
        Arc::new(inbox),
        sink.clone(),
        settings,
        stats.clone(),
        Arc::new(AtomicBool::new(false)),
    );
    let inputs: Vec<Input> = (0..n)
        .map(|o| Input::Record(record(o, bad.contains(&o))))
        .collect();
    let source = futures::stream::iter(inputs);
    tokio::time::timeout(
        Duration::from_secs(60),
        worker.run(source, CancellationToken::new()),
    )
    .await
    .expect("the worker finishes")
    .expect("a poison message does not stop the worker");
    let stored = sink.0.lock().unwrap().clone();
    (stats.snapshot(), stored)
}

/// The database after a run: per-account balances, inbox ids, dead letters
/// (offset, reason, detail), and the stored offset.
async fn state(pool: &Pool) -> (Vec<(i64, i64)>, usize, Vec<(i64, String, String)>, i64) {
    let c = pool.get().await.unwrap();
    let t = tables(pool).await;
    let letters = c
        .query(
            "SELECT \"offset\", reason, coalesce(detail, '') FROM dead_letters ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let next: i64 = c
        .query_one(
            "SELECT next_offset FROM consumer_offsets WHERE group_id = 'g'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    (t.balances, t.inbox.len(), letters, next)
}

/// Balances when every record of `0..n` except `skipped` is applied.
fn expected_balances(n: i64, skipped: &[i64]) -> Vec<(i64, i64)> {
    let mut b = std::collections::BTreeMap::new();
    for o in (0..n).filter(|o| !skipped.contains(o)) {
        *b.entry(o % 5).or_insert(0) += o + 1;
    }
    b.into_iter().collect()
}

fn assert_strictly_increasing(stored: &[i64], last: i64) {
    assert!(stored.windows(2).all(|w| w[0] < w[1]), "{stored:?}");
    assert_eq!(stored.last(), Some(&last), "{stored:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_at_any_position_is_isolated_in_about_log2_n_transactions() {
    let n = 64;
    // 2·log2(64) + 2: one failed whole batch, at most two transactions per level, the failed
    // attempt of the message alone and its dead letter.
    let bound = 2 * 6 + 2;
    for k in [0, 1, 31, 32, 45, 63] {
        let (_, pool) = fresh_db("poison_k").await;
        let (stats, stored) = run(&pool, Mode::Batched, n, &[k], &[]).await;
        let (balances, inbox, letters, next) = state(&pool).await;

        assert_eq!(balances, expected_balances(n, &[k]), "k={k}");
        assert_eq!(
            inbox, n as usize,
            "k={k}: every id is in the inbox, poison included"
        );
        assert_eq!(letters.len(), 1, "k={k}: {letters:?}");
        let (offset, reason, detail) = &letters[0];
        assert_eq!((*offset, reason.as_str()), (k, "handler_error"), "k={k}");
        assert!(detail.contains("division by zero"), "k={k}: {detail}");
        assert_eq!(stats.poisoned, 1, "k={k}");
        let attempts = stats.transactions + stats.poison_failures;
        assert!(
            (7..=bound).contains(&attempts),
            "k={k}: {attempts} transactions for one poison message in 64 (bound {bound})"
        );
        assert_strictly_increasing(&stored, n);
        assert_eq!(next, n, "k={k}: offset in the database");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_poison_messages_and_bad_input_in_one_batch() {
    let (_, pool) = fresh_db("poison_many").await;
    let (n, poison, bad) = (50, [3, 4, 40], [10, 41]);
    let (stats, stored) = run(&pool, Mode::Batched, n, &poison, &bad).await;
    let (balances, inbox, letters, next) = state(&pool).await;

    let skipped: Vec<i64> = poison.iter().chain(&bad).copied().collect();
    assert_eq!(balances, expected_balances(n, &skipped));
    assert_eq!(inbox, 48, "every decodable id, poison included");
    let reasons: Vec<(i64, &str)> = letters.iter().map(|(o, r, _)| (*o, r.as_str())).collect();
    assert_eq!(
        reasons,
        vec![
            (3, "handler_error"),
            (4, "handler_error"),
            (10, "invalid_payload"),
            (40, "handler_error"),
            (41, "invalid_payload"),
        ]
    );
    assert_eq!((stats.poisoned, stats.invalid), (3, 2));
    assert_eq!(stats.records, 50, "each record counted once");
    assert_strictly_increasing(&stored, n);
    assert_eq!(next, n);

    // Redelivered: the poison ids are in the inbox now, so the batch commits at once.
    let (again, _) = run(&pool, Mode::Batched, n, &poison, &bad).await;
    assert_eq!((again.transactions, again.poison_failures), (1, 0));
    assert_eq!((again.new, again.dead_letters_written), (0, 0));
    assert_eq!(state(&pool).await.0, balances, "nothing applied twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_message_baseline_dead_letters_a_poison_message_the_same_way() {
    let (_, pool) = fresh_db("poison_per_message").await;
    let (stats, stored) = run(&pool, Mode::PerMessage, 10, &[3], &[]).await;
    let (balances, inbox, letters, next) = state(&pool).await;

    assert_eq!(balances, expected_balances(10, &[3]));
    assert_eq!(inbox, 10);
    let reasons: Vec<(i64, &str)> = letters.iter().map(|(o, r, _)| (*o, r.as_str())).collect();
    assert_eq!(reasons, vec![(3, "handler_error")]);
    assert_eq!(
        (stats.poison_failures, stats.transactions),
        (1, 10),
        "one failed attempt; nine applied and one dead letter"
    );
    assert_eq!(stored, (1..=10).collect::<Vec<i64>>());
    assert_eq!(next, 10);
}

/// The ledger, also claiming each message's account in `claims`, whose unique key is checked
/// only at COMMIT (`DEFERRABLE INITIALLY DEFERRED`): a second message for an account fails the
/// transaction's COMMIT with 23505.
struct ClaimingLedger;

impl Handler for ClaimingLedger {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        let accounts: Vec<i64> = messages.iter().map(|m| m.payload.account_id).collect();
        tx.execute(
            "INSERT INTO claims SELECT unnest($1::bigint[])",
            &[&accounts],
        )
        .await?;
        Ledger.handle(tx, messages).await
    }
}

/// A unique violation raised at COMMIT by a deferred constraint of the user's is the data's fault:
/// it is bisected to the messages that break it and dead-letters them, like any integrity
/// violation, instead of being taken for a concurrent copy of an inbox id and retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_unique_violation_at_commit_dead_letters_the_messages_that_break_it() {
    let (_, pool) = fresh_db("poison_deferred").await;
    pool.get()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE claims (account bigint,
               CONSTRAINT claims_once UNIQUE (account) DEFERRABLE INITIALLY DEFERRED)",
        )
        .await
        .unwrap();
    // Accounts are offset % 5: offsets 5..9 claim accounts that 0..4 claimed.
    let (_, stored) = run_with(&pool, ClaimingLedger, Mode::Batched, 10, &[]).await;
    let (balances, inbox, letters, next) = state(&pool).await;

    let breaking = [5, 6, 7, 8, 9];
    assert_eq!(balances, expected_balances(10, &breaking));
    assert_eq!(inbox, 10);
    let offsets: Vec<i64> = letters.iter().map(|(o, _, _)| *o).collect();
    assert_eq!(offsets, breaking);
    for (offset, reason, detail) in &letters {
        assert_eq!(reason, "handler_error", "{offset}");
        assert!(detail.contains("claims_once"), "{offset}: {detail}");
    }
    let claims: i64 = pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM claims", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(claims, 5);
    assert_strictly_increasing(&stored, 10);
    assert_eq!(next, 10);
}

/// Fails every batch with a data-class error (22012) until `fixed`: a deployment whose SQL is
/// wrong for every message, which SQLSTATE classification takes for the messages' fault.
struct BrokenUntilFixed {
    fixed: Arc<AtomicBool>,
}

impl Handler for BrokenUntilFixed {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        if !self.fixed.load(std::sync::atomic::Ordering::SeqCst) {
            tx.batch_execute("SELECT 1 / 0").await?;
        }
        Ledger.handle(tx, messages).await
    }
}

/// With `--max-poison-rate 3/1m`, a handler that fails every message dead-letters three, then
/// the partition stalls on the fourth (saying so, and in `/metrics` with `reason="breaker"`, which
/// the breaker's alert selects) instead of dead-lettering the stream; once the handler is fixed,
/// the stalled message and every later one are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poison_rate_breaker_stalls_instead_of_dead_lettering_the_stream() {
    let (url, pool) = fresh_db("poison_breaker").await;
    let fixed = Arc::new(AtomicBool::new(false));
    let handler = Arc::new(BrokenUntilFixed {
        fixed: fixed.clone(),
    });
    let stats = Arc::new(Stats::default());
    let stop = CancellationToken::new();
    let metrics = common::listener(&url, &pool, &stats, &stop).await;
    let stalled = |value: u8| async move {
        let (status, body) = http::get(metrics, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        let series: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with("batch_inbox_stalled{"))
            .collect();
        assert_eq!(
            series,
            [format!(
                "batch_inbox_stalled{{topic=\"t\",partition=\"0\",reason=\"breaker\"}} {value}"
            )],
            "{body}"
        );
    };
    let mut settings = worker_settings(Mode::Batched, 8, 1usize << 20);
    settings.max_poison_rate =
        batch_inbox::internals::worker::parse_max_poison_rate("3/1m").unwrap();
    settings.retry.initial = Duration::from_millis(10);
    settings.retry.max = Duration::from_millis(200);
    let inbox = Inbox::new(pool.clone(), handler, "id").with_offsets_in_db(Some("g"));
    let worker = PartitionWorker::new(
        Arc::from("t"),
        0,
        Arc::new(inbox),
        Arc::new(Recorded::default()),
        settings,
        stats.clone(),
        Arc::new(AtomicBool::new(false)),
    );
    let inputs: Vec<Input> = (0..20).map(|o| Input::Record(record(o, false))).collect();
    let running = tokio::spawn(worker.run(futures::stream::iter(inputs), CancellationToken::new()));

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let reason = loop {
        if let Some(reason) = stats.stall_reason() {
            break reason;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the breaker never stalled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(reason.contains("poison-rate breaker"), "{reason}");
    assert!(reason.contains("SQLSTATE 22012"), "{reason}");
    stalled(1).await;
    let (balances, inbox, letters, _) = state(&pool).await;
    let offsets: Vec<i64> = letters.iter().map(|(o, _, _)| *o).collect();
    assert_eq!(offsets, [0, 1, 2], "three dead letters, then the stall");
    assert_eq!((balances.len(), inbox), (0, 3));

    fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the worker finishes once the handler is fixed")
        .unwrap()
        .expect("no error");
    let (balances, inbox, letters, next) = state(&pool).await;
    assert_eq!(balances, expected_balances(20, &[0, 1, 2]));
    assert_eq!(inbox, 20);
    assert_eq!(letters.len(), 3, "{letters:?}");
    assert_eq!(next, 20);
    assert_eq!(stats.stall_reason(), None);
    stalled(0).await;
    stop.cancel();
}

/// A worker over `inputs` with the breaker `limit` (records of one partition, batches of
/// `batch_size`); returns its stats and its task.
fn spawn_breaker_worker<H: Handler<Payload = Entry>>(
    pool: &Pool,
    handler: H,
    limit: &str,
    batch_size: usize,
    inputs: impl futures::Stream<Item = Input> + Send + 'static,
) -> (
    Arc<Stats>,
    tokio::task::JoinHandle<Result<(), batch_inbox::RunError>>,
) {
    let stats = Arc::new(Stats::default());
    let mut settings = worker_settings(Mode::Batched, batch_size, 1usize << 20);
    settings.set_poison_limit(batch_inbox::internals::worker::parse_poison_limit(limit).unwrap());
    settings.retry.initial = Duration::from_millis(10);
    settings.retry.max = Duration::from_millis(200);
    let inbox = Inbox::new(pool.clone(), Arc::new(handler), "id").with_offsets_in_db(Some("g"));
    let worker = PartitionWorker::new(
        Arc::from("t"),
        0,
        Arc::new(inbox),
        Arc::new(Recorded::default()),
        settings,
        stats.clone(),
        Arc::new(AtomicBool::new(false)),
    );
    let running = tokio::spawn(worker.run(inputs, CancellationToken::new()));
    (stats, running)
}

/// One message in a hundred breaks the handler (1% bad data, 10 of 1000, in batches of 100):
/// with a floor of 3 (a count of 3 a minute stalled the partition on the fourth), each is
/// dead-lettered and everything else is applied, without a stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_percent_bad_data_is_dead_lettered_and_the_partition_flows() {
    let (_, pool) = fresh_db("poison_share_flows").await;
    let poison: Vec<i64> = (0..1000).filter(|o| o % 100 == 37).collect();
    let handler = PoisonLedger {
        poison: poison.iter().map(|o| id(*o)).collect(),
    };
    let inputs: Vec<Input> = (0..1000).map(|o| Input::Record(record(o, false))).collect();
    let (stats, running) = spawn_breaker_worker(
        &pool,
        handler,
        "50%/100,min=3",
        100,
        futures::stream::iter(inputs),
    );
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the partition flows")
        .unwrap()
        .expect("no error");
    let (balances, inbox, letters, next) = state(&pool).await;
    let offsets: Vec<i64> = letters.iter().map(|(o, _, _)| *o).collect();
    assert_eq!(offsets, poison, "each bad message dead-lettered");
    assert_eq!(balances, expected_balances(1000, &poison));
    assert_eq!((inbox, next), (1000, 1000));
    assert_eq!(stats.snapshot().poisoned, 10);
    assert_eq!(stats.stall_reason(), None);
}

/// A deployment that fails every message, on a topic where one arrives every 300 ms (a count
/// of 3 per 100 ms, the old form, would never trip): it dead-letters the floor's 3 and stalls
/// on the fourth all the same, then applies the rest once fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_deployment_on_a_slow_topic_stalls_all_the_same() {
    use futures::StreamExt as _;
    let (_, pool) = fresh_db("poison_share_slow").await;
    let fixed = Arc::new(AtomicBool::new(false));
    let handler = BrokenUntilFixed {
        fixed: fixed.clone(),
    };
    let inputs = futures::stream::iter(0..10).then(|o| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Input::Record(record(o, false))
    });
    let (stats, running) = spawn_breaker_worker(&pool, handler, "3/100ms", 1, inputs);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let reason = loop {
        if let Some(reason) = stats.stall_reason() {
            break reason;
        }
        assert!(std::time::Instant::now() < deadline, "never stalled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(reason.contains("poison-rate breaker"), "{reason}");
    let (_, _, letters, _) = state(&pool).await;
    let offsets: Vec<i64> = letters.iter().map(|(o, _, _)| *o).collect();
    assert_eq!(offsets, [0, 1, 2], "the floor's three, then the stall");

    fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the worker finishes once the handler is fixed")
        .unwrap()
        .expect("no error");
    let (balances, inbox, letters, next) = state(&pool).await;
    assert_eq!(balances, expected_balances(10, &[0, 1, 2]));
    assert_eq!((inbox, letters.len(), next), (10, 3, 10));
    assert_eq!(stats.stall_reason(), None);
}

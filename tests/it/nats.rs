//! The binary reading a NATS JetStream stream (`--source nats://…`), each test against a
//! nats-server of its own (`common::nats`): exactly once under duplicates and bad input, a
//! SIGKILL of the processor, a SIGKILL of the server, a standby's takeover, several streams in
//! one process, a PostgreSQL restart, a stall longer than the consumer's AckWait, header bytes no
//! client library would send, a database restored from a copy, the consumer settings refused at
//! start, and the password never shown.

use std::time::{Duration, Instant};

use batch_inbox_tools::generate::{Expected, Record};
use deadpool_postgres::Pool;
use serde_json::json;

use crate::common::child::{Finished, Running};
use crate::common::ledger_checks::{
    self, assert_exact, assert_exact_after_a_republish, dead_letter_rows, readyz_becomes,
    served_sample, stored_position, wait_for_exact, wait_for_rows,
};
use crate::common::nats::{
    distinct_invalid_ids, header_block, id_line, ledger_message, Client, ConsumerInfo, NatsServer,
    Publish,
};
use crate::common::postgres::PrivatePostgres;
use crate::common::{db_name, db_url, fresh_db, group};

/// The stream of the tests, on subjects `ledger.<account>`.
const STREAM: &str = "ledger";
const PREFIX: &str = "ledger";

/// The consumer's name when `--consumer` is not given: the `--group` default.
const GROUP: &str = "batch-inbox";

/// The input of a test: generated records with duplicates, bad input and overdrafts (each
/// invalid id text distinct: [`distinct_invalid_ids`]).
fn input(messages: u64, seed: u64) -> (Vec<Record>, Expected) {
    let (records, expected) = ledger_checks::input(messages, seed);
    (distinct_invalid_ids(&records), expected)
}

/// A client of `server` with the ledger stream created.
async fn ledger_stream(server: &NatsServer) -> Client {
    let mut nats = server.client().await;
    nats.create_stream(STREAM, &["ledger.>"], json!({})).await;
    nats
}

/// The binary reading `STREAM` of `server` into the database at `db` (a URL) with `extra` flags.
fn spawn(server: &NatsServer, db: &str, extra: &[&str]) -> Running {
    spawn_streams(server, db, STREAM, extra)
}

/// The binary reading `streams` (`--stream`: a name or a comma list) of `server` into the
/// database at `db` with `extra` flags.
fn spawn_streams(server: &NatsServer, db: &str, streams: &str, extra: &[&str]) -> Running {
    let url = server.url();
    let mut args = vec![
        "run",
        "--source",
        url.as_str(),
        "--stream",
        streams,
        "--log-interval",
        "0",
    ];
    args.extend(extra);
    Running::spawn(&args, &[("DATABASE_URL", db)])
}

/// Waits for `process` to exit (at most `limit`); its output never shows the password.
async fn finish(server: &NatsServer, process: Running, limit: Duration) -> Finished {
    let out = process.wait(limit).await;
    server.assert_no_secret(&out);
    out
}

/// Runs the binary with `--exit-on-eof` and `extra` flags until it exits 0 (at most 120 s).
async fn run_to_eof(server: &NatsServer, db: &str, extra: &[&str]) -> Finished {
    let mut flags = vec!["--exit-on-eof"];
    flags.extend(extra);
    let out = finish(server, spawn(server, db, &flags), Duration::from_secs(120)).await;
    out.assert_exit(0);
    out
}

/// The database's position of `consumer` on the stream is `next`.
async fn assert_position(pool: &Pool, consumer: &str, next: u64) {
    assert_eq!(
        stored_position(pool, consumer, STREAM).await,
        Some(next as i64)
    );
}

/// The database's position of `consumer` on the stream (-1: none).
async fn db_position(pool: &Pool, consumer: &str) -> i64 {
    stored_position(pool, consumer, STREAM).await.unwrap_or(-1)
}

/// What JetStream says of `consumer`, checked against the database: nothing acknowledged that
/// the database has not committed (the ack floor below its position).
async fn acknowledged_within_the_database(nats: &mut Client, pool: &Pool) -> ConsumerInfo {
    let info = nats.consumer_info(STREAM, GROUP).await.expect("a consumer");
    let next = db_position(pool, GROUP).await; // read second: it only moves forward
    assert!(
        (info.ack_floor as i64) < next.max(1),
        "acknowledged past the database's position {next}: {info:?}"
    );
    info
}

/// Waits until `stream`'s consumer exists (at most 60 s); returns what JetStream says of it.
async fn wait_for_consumer(nats: &mut Client, stream: &str) -> ConsumerInfo {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(info) = nats.consumer_info(stream, GROUP).await {
            return info;
        }
        assert!(Instant::now() < deadline, "no consumer on {stream}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `stream`'s consumer has nothing pending and nothing unacknowledged (at most 60 s:
/// the last batch's acknowledgement leaves after its COMMIT); returns what JetStream says of it.
async fn wait_until_drained(nats: &mut Client, stream: &str) -> ConsumerInfo {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let info = nats.consumer_info(stream, GROUP).await.expect("a consumer");
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            return info;
        }
        assert!(Instant::now() < deadline, "{stream} not drained: {info:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the database's position of `consumer` is `next` (at most 120 s): everything
/// before it read and committed (the state may be the model's earlier, with duplicates left).
async fn wait_for_position(pool: &Pool, consumer: &str, next: u64) {
    group::wait_for("the position", 120, || async {
        db_position(pool, consumer).await == next as i64
    })
    .await;
}

/// The redeliveries the processor at `metrics` counted; the metric must be served.
async fn redeliveries(metrics: std::net::SocketAddr) -> f64 {
    served_sample(metrics, "batch_inbox_redeliveries_total").await
}

/// The ledger's table held by a transaction of the test's (`LOCK TABLE … IN ACCESS EXCLUSIVE
/// MODE`), so that the processor's batch in flight waits on it, uncommitted and unacknowledged.
struct TableLock(deadpool_postgres::Object);

impl TableLock {
    /// Takes the lock and returns once a batch of the processor waits on it (at most 60 s).
    async fn hold(pool: &Pool) -> TableLock {
        let lock = Self::take(pool).await;
        lock.until_a_batch_waits(pool).await;
        lock
    }

    /// Takes the lock, whether or not a batch is in flight.
    async fn take(pool: &Pool) -> TableLock {
        let client = pool.get().await.unwrap();
        client
            .batch_execute("BEGIN; LOCK TABLE balances IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        TableLock(client)
    }

    /// Returns once a batch of the processor waits on the lock (at most 60 s).
    async fn until_a_batch_waits(&self, pool: &Pool) {
        group::wait_for("a batch waiting on the lock", 60, || async {
            let row = pool
                .get()
                .await
                .unwrap()
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0) > 0
        })
        .await;
    }

    async fn release(self) {
        self.0.batch_execute("COMMIT").await.unwrap();
    }
}

/// Publishes `records` and waits until the database holds them all (at most 120 s).
async fn publish_committed(nats: &mut Client, pool: &Pool, records: &[Record]) {
    let seqs = nats.publish_records(PREFIX, records).await;
    wait_for_position(pool, GROUP, seqs.iter().max().unwrap() + 1).await;
}

/// Publishes `records` with the ledger's table locked and returns the lock once a batch of them
/// waits on it, uncommitted and unacknowledged: a fault comes in the middle whatever the
/// machine's speed. Nothing the database has not committed is acknowledged by then.
async fn hold_a_batch_of(
    nats: &mut Client,
    pool: &Pool,
    records: &[Record],
    expected: &Expected,
) -> TableLock {
    let lock = TableLock::take(pool).await;
    nats.publish_records(PREFIX, records).await;
    lock.until_a_batch_waits(pool).await;
    let applied = group::inbox_rows(pool).await;
    assert!(applied < expected.new, "all applied already: {applied}");
    let info = acknowledged_within_the_database(nats, pool).await;
    assert!(info.num_ack_pending > 0, "nothing in flight: {info:?}");
    lock
}

/// Waits until the database is the model's with the stream's `last` sequence committed and
/// acknowledged, nothing pending or delivered again.
async fn wait_for_the_end(nats: &mut Client, pool: &Pool, expected: &Expected, last: u64) {
    wait_for_exact(pool, expected).await;
    wait_for_position(pool, GROUP, last + 1).await;
    let info = wait_until_drained(nats, STREAM).await;
    assert_eq!((info.num_redelivered, info.ack_floor), (0, last));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_applied_exactly_once_and_a_republish_adds_nothing() {
    let server = NatsServer::start().await;
    let mut nats = ledger_stream(&server).await;
    let (db, pool) = fresh_db("nats_once").await;
    let (records, expected) = input(20_000, 7);
    assert!(expected.duplicates > 0 && expected.dead_letters.len() >= 4);
    let seqs = nats.publish_records(PREFIX, &records).await;
    assert_eq!(seqs.iter().max(), Some(&20_000));

    let out = run_to_eof(&server, &db, &["--batch-size", "400"]).await;
    assert!(out.stdout.contains("records 20000 "), "{}", out.stdout);
    assert_exact(&pool, &expected).await;
    assert_position(&pool, GROUP, 20_001).await;
    // The consumer as the source creates it: durable, pulled, acknowledged up to a position,
    // twice a batch unacknowledged at most, redelivered without limit after 30 s.
    let info = nats.consumer_info(STREAM, GROUP).await.expect("a consumer");
    assert_eq!(info.config["durable_name"], GROUP, "{:?}", info.config);
    assert_eq!(info.config["ack_policy"], "all", "{:?}", info.config);
    assert_eq!(info.config["deliver_policy"], "all", "{:?}", info.config);
    assert_eq!(info.config["max_ack_pending"], 800, "{:?}", info.config);
    assert_eq!(info.config["max_deliver"], -1, "{:?}", info.config);
    assert_eq!(
        info.config["ack_wait"], 30_000_000_000u64,
        "{:?}",
        info.config
    );
    assert!(
        info.config.get("deliver_subject").is_none(),
        "{:?}",
        info.config
    );
    assert_eq!(
        (info.num_pending, info.num_ack_pending, info.ack_floor),
        (0, 0, 20_000)
    );

    // Every record published once more, with its id (a publisher that resends all, past the
    // server's duplicate window): nothing is applied again, and everything is acknowledged.
    let again = nats.publish_records(PREFIX, &records).await;
    assert_eq!(again.iter().min(), Some(&20_001));
    let out = run_to_eof(&server, &db, &["--batch-size", "400"]).await;
    assert!(
        out.stdout.contains("records 20000 new 0 "),
        "{}",
        out.stdout
    );
    // The bad records published again are new messages (new sequences), each dead-lettered once
    // more; nothing else changed.
    assert_exact_after_a_republish(&pool, &expected).await;
    assert_position(&pool, GROUP, 40_001).await;
    let info = nats.consumer_info(STREAM, GROUP).await.expect("a consumer");
    assert_eq!((info.num_pending, info.ack_floor), (0, 40_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_of_the_processor_applies_nothing_twice() {
    let server = NatsServer::start().await;
    let mut nats = ledger_stream(&server).await;
    let (db, pool) = fresh_db("nats_kill").await;
    let (records, expected) = input(30_000, 11);
    nats.publish_records(PREFIX, &records).await;
    // Small batches, so that the kill lands between commits with deliveries unacknowledged; a
    // short AckWait, so that what the dead process held comes again soon.
    let flags = ["--batch-size", "100", "--ack-wait", "3s"];
    let child = spawn(&server, &db, &flags);
    wait_for_rows(&pool, expected.new / 3).await;
    let killed = child.kill().await;
    server.assert_no_secret(&killed);
    assert_eq!(killed.code, None, "{}", killed.stderr);
    let applied = group::inbox_rows(&pool).await;
    assert!(applied < expected.new, "the kill came too late: {applied}");
    acknowledged_within_the_database(&mut nats, &pool).await;

    run_to_eof(&server, &db, &flags).await;
    // Dead letters are keyed by stream sequence: one redelivered adds no second row.
    assert_exact(&pool, &expected).await;
    assert_position(&pool, GROUP, 30_001).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_of_the_server_is_ridden_out_exactly_once() {
    let mut server = NatsServer::start().await;
    let mut nats = ledger_stream(&server).await;
    let (db, pool) = fresh_db("nats_server_kill").await;
    let (records, expected) = input(30_000, 13);
    nats.publish_records(PREFIX, &records).await;
    drop(nats);
    let flags = ["--batch-size", "200", "--ack-wait", "3s", "--exit-on-eof"];
    let child = spawn(&server, &db, &flags);
    wait_for_rows(&pool, expected.new / 4).await;
    // Held in the middle whatever the machine's speed: a batch waits on the ledger's table,
    // uncommitted and unacknowledged, while the server dies and comes back on its store.
    let lock = TableLock::hold(&pool).await;
    let applied = group::inbox_rows(&pool).await;
    assert!(
        applied < expected.new,
        "finished before the kill: {applied}"
    );
    server.kill();
    server.start_again().await;
    let mut nats = server.client().await;
    let state = nats.stream_state(STREAM).await;
    assert_eq!(
        (state["messages"].as_u64(), state["last_seq"].as_u64()),
        (Some(30_000), Some(30_000)),
        "the store lost messages: {state}"
    );
    acknowledged_within_the_database(&mut nats, &pool).await;
    lock.release().await;

    let out = finish(&server, child, Duration::from_secs(180)).await;
    out.assert_exit(0);
    assert_exact(&pool, &expected).await;
    assert_position(&pool, GROUP, 30_001).await;
    let info = nats.consumer_info(STREAM, GROUP).await.expect("a consumer");
    assert_eq!(
        (info.num_pending, info.num_ack_pending, info.ack_floor),
        (0, 0, 30_000)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_longer_than_the_ack_wait_redelivers_nothing() {
    const ACK_WAIT: Duration = Duration::from_secs(2);
    let server = NatsServer::start().await;
    let mut nats = ledger_stream(&server).await;
    let (db, pool) = fresh_db("nats_stall").await;
    let (records, expected) = input(10_000, 19);
    nats.publish_records(PREFIX, &records).await;
    let mut child = spawn(
        &server,
        &db,
        &[
            "--batch-size",
            "100",
            "--ack-wait",
            "2s",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let metrics = child.metrics_addr().await;
    wait_for_rows(&pool, expected.new / 4).await;
    let info = nats.consumer_info(STREAM, GROUP).await.expect("a consumer");
    assert_eq!(info.config["ack_wait"], ACK_WAIT.as_nanos() as u64);

    // A batch held on the database for three times the AckWait: what the processor holds
    // unacknowledged is never redelivered meanwhile, and nothing is applied or dead-lettered.
    let lock = TableLock::hold(&pool).await;
    // (balances is locked: only the other tables are read meanwhile)
    let held_at = (
        group::inbox_rows(&pool).await,
        dead_letter_rows(&pool).await,
    );
    let until = Instant::now() + 3 * ACK_WAIT;
    while Instant::now() < until {
        let info = acknowledged_within_the_database(&mut nats, &pool).await;
        assert!(info.num_ack_pending > 0, "nothing in flight: {info:?}");
        assert_eq!(info.num_redelivered, 0, "redelivered while held: {info:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let still = (
        group::inbox_rows(&pool).await,
        dead_letter_rows(&pool).await,
    );
    assert_eq!(
        still, held_at,
        "(inbox rows, dead letters) changed while held"
    );
    lock.release().await;

    wait_for_exact(&pool, &expected).await;
    wait_for_position(&pool, GROUP, 10_001).await;
    assert_eq!(redeliveries(metrics).await, 0.0);
    let out = child.stop().await;
    server.assert_no_secret(&out);
    out.assert_exit(0);
    assert!(
        out.stdout.contains("records 10000 "),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert_exact(&pool, &expected).await;
    assert_position(&pool, GROUP, 10_001).await;
    let info = nats.consumer_info(STREAM, GROUP).await.expect("a consumer");
    assert_eq!((info.num_redelivered, info.ack_floor), (0, 10_000));
}

/// The account of the records with hostile headers (none of the model's).
const HOSTILE_ACCOUNT: i64 = 999_999;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_bytes_become_records_or_dead_letters_never_a_stopped_consumer() {
    let server = NatsServer::start().await;
    let mut nats = ledger_stream(&server).await;
    let (db, pool) = fresh_db("nats_bytes").await;
    let (records, mut expected) = input(600, 11);

    // Among the records, one message in fifteen of three kinds:
    // - a valid id and entry (to an account of its own) with headers no client library sends: a
    //   name and a value that are not UTF-8, a name with a space, a line without a colon, NUL
    //   bytes; each is applied or dead-lettered, whatever the source makes of its headers;
    // - an id that is not UTF-8: dead-lettered (invalid_id), its bytes kept;
    // - no id, with other headers or none at all: dead-lettered (missing_id).
    let entry = |account: i64| format!(r#"{{"account_id":{account},"amount":1}}"#).into_bytes();
    let subject = format!("{PREFIX}.{HOSTILE_ACCOUNT}");
    let hostile_message = |headers: Option<Vec<u8>>| Publish {
        subject: subject.clone(),
        headers,
        payload: entry(HOSTILE_ACCOUNT),
    };
    // (the valid id of a message with hostile headers, the message)
    let mut hostile: Vec<(Option<uuid::Uuid>, Publish)> = Vec::new();
    for i in 0..20 {
        let id = uuid::Uuid::new_v4();
        let line = id_line(id.to_string().as_bytes());
        let lines: Vec<&[u8]> = match i % 5 {
            0 => vec![&line, b"\xff\xfe: \xc3\x28"],
            1 => vec![b"with space: v", &line],
            2 => vec![&line, b"no colon at all"],
            3 => vec![b"\xc3\x28", &line, b"X-Bin: \x00\x01\xff"],
            _ => vec![b"X-\x80\x81: \xff", &line, b": no name"],
        };
        hostile.push((Some(id), hostile_message(Some(header_block(&lines)))));
    }
    let invalid: Vec<Vec<u8>> = (0..10u8).map(|i| vec![0xff, 0xfe, i]).collect();
    let invalid_at = hostile.len();
    for id in &invalid {
        hostile.push((None, hostile_message(Some(header_block(&[&id_line(id)])))));
    }
    let missing_at = hostile.len();
    for i in 0..10 {
        let headers = (i % 2 == 0).then(|| header_block(&[b"X-Other: 1"]));
        hostile.push((None, hostile_message(headers)));
    }
    // Interleaved: records, then one hostile message, and again.
    let mut messages = Vec::new();
    let mut hostile_index = Vec::new(); // position in `messages` of hostile message i
    let mut rest = hostile.iter();
    for (i, r) in records.iter().enumerate() {
        messages.push(ledger_message(PREFIX, r));
        if i % 15 == 7 {
            if let Some((_, m)) = rest.next() {
                hostile_index.push(messages.len());
                messages.push(m.clone());
            }
        }
    }
    for (_, m) in rest {
        hostile_index.push(messages.len());
        messages.push(m.clone());
    }
    let total = messages.len() as u64;
    assert_eq!(total, 640);
    let seqs = nats.publish_stored(&messages).await;
    let seq_of = |i: usize| seqs[hostile_index[i]] as i64;

    let out = run_to_eof(&server, &db, &[]).await;
    assert!(out.stdout.contains("records 640 "), "{}", out.stdout);
    assert_position(&pool, GROUP, total + 1).await;

    let client = pool.get().await.unwrap();
    // Each message with hostile headers: in the inbox or a dead letter, exactly one of them.
    let mut applied = 0i64;
    for (i, (id, m)) in hostile.iter().enumerate().take(invalid_at) {
        let inbox: i64 = client
            .query_one("SELECT count(*) FROM inbox WHERE message_id = $1", &[id])
            .await
            .unwrap()
            .get(0);
        let letters = client
            .query(
                "SELECT reason FROM dead_letters WHERE topic = $1 AND \"offset\" = $2",
                &[&STREAM, &seq_of(i)],
            )
            .await
            .unwrap();
        assert_eq!(inbox + letters.len() as i64, 1, "message {i}: {m:?}");
        applied += inbox;
        for row in letters {
            *expected.dead_letters.entry(row.get(0)).or_default() += 1;
        }
    }
    if applied > 0 {
        expected.balances.insert(HOSTILE_ACCOUNT, applied);
    }
    expected.new += applied as u64;
    // The ids that are not UTF-8 and the missing ones: dead letters of those reasons, at their
    // sequences, the bytes of each id kept.
    for (range, reason) in [
        (invalid_at..missing_at, "invalid_id"),
        (missing_at..hostile.len(), "missing_id"),
    ] {
        let at: Vec<i64> = range.clone().map(seq_of).collect();
        let rows = client
            .query(
                "SELECT reason, coalesce(message_id_raw, key) FROM dead_letters \
                 WHERE topic = $1 AND \"offset\" = ANY($2) ORDER BY \"offset\"",
                &[&STREAM, &at],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), at.len(), "{reason}");
        for (row, i) in rows.iter().zip(range) {
            assert_eq!(row.get::<_, String>(0), reason, "message {i}");
            if reason == "invalid_id" {
                let raw: Option<Vec<u8>> = row.get(1);
                assert_eq!(raw.as_deref(), Some(&invalid[i - invalid_at][..]));
            }
        }
        *expected.dead_letters.entry(reason.to_owned()).or_default() += at.len() as u64;
    }
    assert_exact(&pool, &expected).await;
}

/// Copies database `from` as `to` (`CREATE DATABASE … TEMPLATE`, once nothing is connected to
/// `from`): a backup of it, restored under another name. Returns the copy's URL.
async fn copy_database(from: &str, to: &str) -> String {
    let admin = batch_inbox::db::connect(&db_url("postgres"), 1)
        .await
        .unwrap();
    let c = admin.get().await.unwrap();
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {to} WITH (FORCE)"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            &[&from],
        )
        .await
        .unwrap();
        match c
            .batch_execute(&format!("CREATE DATABASE {to} TEMPLATE {from}"))
            .await
        {
            Ok(()) => return db_url(to),
            Err(e) => assert!(Instant::now() < deadline, "copy of {from}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restored_from_a_copy_gets_every_record_again() {
    let server = NatsServer::start().await;
    let mut nats = ledger_stream(&server).await;
    let (db_a, pool) = fresh_db("nats_restore_a").await;
    let (records, expected) = input(10_000, 23);
    let (first, second) = records.split_at(5_000);
    nats.publish_records(PREFIX, first).await;
    let out = run_to_eof(&server, &db_a, &["--batch-size", "200"]).await;
    assert!(out.stdout.contains("records 5000 "), "{}", out.stdout);
    drop(pool);

    // B: A as it is now, a backup; then A reads on and the consumer acknowledges the rest.
    let db_b = copy_database(&db_name("nats_restore_a"), &db_name("nats_restore_b")).await;
    nats.publish_records(PREFIX, second).await;
    let out = run_to_eof(&server, &db_a, &["--batch-size", "200"]).await;
    assert!(out.stdout.contains("records 5000 "), "{}", out.stdout);
    let pool_a = batch_inbox::db::connect(&db_a, 2).await.unwrap();
    assert_exact(&pool_a, &expected).await;
    assert_position(&pool_a, GROUP, 10_001).await;
    let info = nats.consumer_info(STREAM, GROUP).await.expect("a consumer");
    assert_eq!(info.ack_floor, 10_000);

    // B restored behind what the consumer acknowledged: it is read again from its own position,
    // every record after it, and ends as A did.
    let out = run_to_eof(&server, &db_b, &["--batch-size", "200"]).await;
    assert!(out.stdout.contains("records 5000 "), "{}", out.stdout);
    let pool_b = batch_inbox::db::connect(&db_b, 2).await.unwrap();
    assert_exact(&pool_b, &expected).await;
    assert_position(&pool_b, GROUP, 10_001).await;
    let info = nats.consumer_info(STREAM, GROUP).await.expect("a consumer");
    assert_eq!((info.num_pending, info.ack_floor), (0, 10_000));
}

/// `text` lowercase without `_`, `-` and spaces: `AckPolicy`, `ack_policy` and `ack policy`
/// read alike.
fn squeezed(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter(|c| !matches!(c, '_' | '-' | ' '))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_settings_that_break_the_guarantee_are_refused_and_the_password_never_shown() {
    let server = NatsServer::start().await;
    let mut nats = ledger_stream(&server).await;
    let (db, _pool) = fresh_db("nats_refused").await;

    // Consumers that exist with a setting that loses or parks records: refused at start, the
    // setting named, the consumer left as it was.
    let refused = [
        (
            "no_acks",
            json!({"ack_policy": "none", "deliver_policy": "all"}),
            &["ackpolicy"][..],
        ),
        (
            "pushed",
            json!({"ack_policy": "all", "deliver_policy": "all", "deliver_subject": "push.here"}),
            &["deliversubject", "push"][..],
        ),
        (
            "limited",
            json!({"ack_policy": "all", "deliver_policy": "all", "max_deliver": 5}),
            &["maxdeliver"][..],
        ),
    ];
    for (consumer, config, names) in refused {
        let created = nats.create_consumer(STREAM, consumer, config).await;
        assert!(created.get("error").is_none(), "{created}");
        let before = nats.consumer_info(STREAM, consumer).await.unwrap().config;
        let out = finish(
            &server,
            spawn(&server, &db, &["--consumer", consumer, "--exit-on-eof"]),
            Duration::from_secs(60),
        )
        .await;
        // A start-up failure (docs/OPERATIONS.md, "Exit codes and start-up").
        assert_eq!(out.code, Some(1), "{consumer}: {}", out.stderr);
        let said = squeezed(&out.stderr);
        assert!(
            names.iter().any(|n| said.contains(n)),
            "{consumer}: {}",
            out.stderr
        );
        let after = nats.consumer_info(STREAM, consumer).await.unwrap().config;
        assert_eq!(before, after, "{consumer} changed");
    }

    // A stream that drops records by age or by interest: a warning at start, then read.
    for (stream, config, name) in [
        ("aged", json!({"max_age": 3_600_000_000_000u64}), "maxage"),
        ("interest", json!({"retention": "interest"}), "interest"),
    ] {
        let subjects = format!("{stream}.>");
        nats.create_stream(stream, &[&subjects], config).await;
        let url = server.url();
        let out = finish(
            &server,
            Running::spawn(
                &["run", "--source", &url, "--stream", stream, "--exit-on-eof"],
                &[("DATABASE_URL", &db)],
            ),
            Duration::from_secs(60),
        )
        .await;
        out.assert_exit(0);
        assert!(squeezed(&out.stderr).contains(name), "{}", out.stderr);
    }

    // A refused login ends the start at once, without either password.
    let wrong = "Wr0ngNatsPassw0rd";
    let started = Instant::now();
    let out = finish(
        &server,
        Running::spawn(
            &[
                "run",
                "--source",
                &server.url_with_password(wrong),
                "--stream",
                STREAM,
                "--exit-on-eof",
            ],
            &[("DATABASE_URL", &db)],
        ),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused after {:?}",
        started.elapsed()
    );
    assert!(!out.stderr.contains(wrong) && !out.stdout.contains(wrong));
    assert!(nats.consumer_info(STREAM, GROUP).await.is_none());

    // --stream is required (the URL never shown).
    let url = server.url();
    let out = finish(
        &server,
        Running::spawn(&["run", "--source", &url], &[("DATABASE_URL", &db)]),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--stream"), "{}", out.stderr);

    // --print-config shows the source with its password masked.
    let out = finish(
        &server,
        spawn(&server, &db, &["--print-config", "--consumer", "c1"]),
        Duration::from_secs(30),
    )
    .await;
    out.assert_exit(0);
    assert!(out.stdout.contains("nats://app:"), "{}", out.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_and_metrics_while_a_filtered_consumer_reads() {
    let server = NatsServer::start().await;
    let mut nats = server.client().await;
    nats.create_stream(STREAM, &["ledger.>", "noise.>"], json!({}))
        .await;
    let (db, pool) = fresh_db("nats_readyz").await;
    let (records, expected) = input(2_000, 29);
    let mut p = spawn(
        &server,
        &db,
        &[
            "--filter-subject",
            "ledger.>",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let metrics = p.metrics_addr().await;
    // Ready before any message (from the moment it asks for the stream's lock: the consumer is
    // created by the run that follows).
    readyz_becomes(metrics, 200).await;
    let info = wait_for_consumer(&mut nats, STREAM).await;
    assert_eq!(
        info.config["filter_subject"], "ledger.>",
        "{:?}",
        info.config
    );

    // Messages outside the filter first (were they read, each would be a dead letter: no id),
    // then the records.
    let noise: Vec<Publish> = (0..50)
        .map(|i| Publish {
            subject: format!("noise.{i}"),
            headers: None,
            payload: b"not for this consumer".to_vec(),
        })
        .collect();
    nats.publish_stored(&noise).await;
    let seqs = nats.publish_records(PREFIX, &records).await;
    let last = *seqs.iter().max().unwrap();
    assert_eq!(last, 2_050);
    wait_for_exact(&pool, &expected).await;
    wait_for_position(&pool, GROUP, last + 1).await;
    readyz_becomes(metrics, 200).await;
    assert_eq!(redeliveries(metrics).await, 0.0);

    let out = p.stop().await;
    server.assert_no_secret(&out);
    out.assert_exit(0);
    assert_exact(&pool, &expected).await;
    assert_position(&pool, GROUP, last + 1).await;
}

/// What an instance logs when another one holds the stream's lock.
const STANDING_BY: &str = "another instance reads the consumer: standing by";

/// What a run logs when it creates the consumer again at the database's position because an
/// earlier run's deliveries were never committed.
const CREATED_AGAIN: &str =
    "the consumer delivered past the database's position what no run committed";

/// What a run logs when the database session holding its stream's lock is gone.
const LOCK_LOST: &str = "the database session holding the stream's lock is gone";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_reading_instance_is_killed() {
    let server = NatsServer::start().await;
    let mut nats = ledger_stream(&server).await;
    let (db, pool) = fresh_db("nats_standby").await;
    let (records, expected) = input(20_000, 31);

    // Two instances of one consumer: the one holding the stream's lock reads, the other stands by.
    let flags = [
        "--batch-size",
        "100",
        "--ack-wait",
        "2s",
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let mut first = spawn(&server, &db, &flags);
    let first_metrics = first.metrics_addr().await;
    let mut second = spawn(&server, &db, &flags);
    let second_metrics = second.metrics_addr().await;
    let stands_by = |p: &Running| p.stderr_lines().iter().any(|l| l.contains(STANDING_BY));
    group::wait_for("an instance standing by", 60, || async {
        stands_by(&first) || stands_by(&second)
    })
    .await;
    let (active, active_metrics, standby, standby_metrics) = match stands_by(&second) {
        true => (first, first_metrics, second, second_metrics),
        false => (second, second_metrics, first, first_metrics),
    };
    assert!(!stands_by(&active), "both stand by");
    // Both ready: one reads the stream, the other stands by for it.
    readyz_becomes(active_metrics, 200).await;
    readyz_becomes(standby_metrics, 200).await;

    let (before, after) = records.split_at(records.len() / 2);
    publish_committed(&mut nats, &pool, before).await;
    // Only the active one has read anything.
    const CONSUMED: &str = "batch_inbox_messages_consumed_total";
    assert!(served_sample(active_metrics, CONSUMED).await > 0.0);
    assert_eq!(served_sample(standby_metrics, CONSUMED).await, 0.0);

    // Killed with a batch of the second half held.
    let lock = hold_a_batch_of(&mut nats, &pool, after, &expected).await;
    // (No request to the consumer from here on until the standby has read all: one would change
    // what the server does with the dead instance's pull request.)
    let killed = active.kill().await;
    server.assert_no_secret(&killed);
    assert_eq!(killed.code, None, "{}", killed.stderr);
    lock.release().await;

    // The standby takes the lock, creates the consumer again at the database's position (the
    // dead one's deliveries are never delivered again out of order) and reads to the end.
    wait_for_the_end(&mut nats, &pool, &expected, 20_000).await;
    assert!(served_sample(standby_metrics, CONSUMED).await > 0.0);
    assert_eq!(redeliveries(standby_metrics).await, 0.0);
    let out = standby.stop().await;
    server.assert_no_secret(&out);
    out.assert_exit(0);
    assert!(out.stderr.contains(CREATED_AGAIN), "{}", out.stderr);
    assert_exact(&pool, &expected).await;
    assert_position(&pool, GROUP, 20_001).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_streams_in_one_process_are_each_applied_at_their_own_position() {
    const STREAMS: [&str; 3] = ["ledger_a", "ledger_b", "ledger_c"];
    let server = NatsServer::start().await;
    let mut nats = server.client().await;
    for stream in STREAMS {
        nats.create_stream(stream, &[&format!("{stream}.>")], json!({}))
            .await;
    }
    let (db, pool) = fresh_db("nats_streams").await;
    let (records, expected) = input(15_000, 37);
    // Each account's records to one stream (subjects `<stream>.<account>`), in their order: the
    // ledger's rules are per account and a duplicate is its account's, so the model holds
    // whatever order the streams are read in.
    let mut parts: [Vec<Record>; 3] = Default::default();
    for r in records {
        let account: usize = r.key.parse().expect("an account id");
        parts[account % 3].push(r);
    }
    let mut last = Vec::new();
    for (stream, part) in STREAMS.iter().zip(&parts) {
        assert!(part.len() > 4_000, "{stream}: {}", part.len());
        let seqs = nats.publish_records(stream, part).await;
        last.push(*seqs.iter().max().unwrap());
        assert_eq!(last.last(), Some(&(part.len() as u64)));
    }

    let out = finish(
        &server,
        spawn_streams(
            &server,
            &db,
            &STREAMS.join(","),
            &["--batch-size", "200", "--exit-on-eof"],
        ),
        Duration::from_secs(120),
    )
    .await;
    out.assert_exit(0);
    assert!(out.stdout.contains("records 15000 "), "{}", out.stdout);
    assert_exact(&pool, &expected).await;
    // Each stream's position is its own: its last sequence + 1, under the consumer's name; its
    // consumer acknowledged all of it; its dead letters are kept under its name.
    for (stream, last) in STREAMS.iter().zip(&last) {
        assert_eq!(
            stored_position(&pool, GROUP, stream).await,
            Some(*last as i64 + 1),
            "{stream}"
        );
        let info = nats.consumer_info(stream, GROUP).await.expect("a consumer");
        assert_eq!(
            (info.num_pending, info.num_ack_pending, info.ack_floor),
            (0, 0, *last),
            "{stream}"
        );
    }
    let client = pool.get().await.unwrap();
    let topics = |sql: &'static str| {
        let client = &client;
        async move {
            let rows = client.query(sql, &[]).await.unwrap();
            rows.iter().map(|r| r.get(0)).collect::<Vec<String>>()
        }
    };
    assert_eq!(
        topics("SELECT topic FROM consumer_offsets ORDER BY 1").await,
        STREAMS
    );
    assert_eq!(
        topics("SELECT DISTINCT topic FROM dead_letters ORDER BY 1").await,
        STREAMS
    );
}

/// The run after the restart must not get its deliveries out of order: nats-server 2.9.10 takes
/// the first expired one off its redelivery queue for a pull request of the lost connection still
/// waiting, and would deliver it again after the others. Before the consumer was created again
/// at the database's position, every run of this test lost the record at that position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_is_ridden_out_exactly_once_and_readyz_follows_it() {
    let pg = PrivatePostgres::start();
    let (db, pool) = pg.ledger_db("nats_pg").await;
    let server = NatsServer::start().await;
    let mut nats = ledger_stream(&server).await;
    let (records, expected) = input(20_000, 41);
    let mut p = spawn(
        &server,
        &db,
        &[
            "--batch-size",
            "100",
            "--ack-wait",
            "2s",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let metrics = p.metrics_addr().await;
    // Ready before any message.
    readyz_becomes(metrics, 200).await;
    let (before, after) = records.split_at(records.len() / 2);
    publish_committed(&mut nats, &pool, before).await;

    // Crashed with a batch of the second half held (every session cut, the lock's too).
    let lock = hold_a_batch_of(&mut nats, &pool, after, &expected).await;
    // (No request to the consumer from here on until the end: one would change what the server
    // does with the lost connection's pull request.)
    pg.stop_immediate();
    drop(lock);
    let body = readyz_becomes(metrics, 503).await;
    assert_eq!(body, "not ready: database\n");
    // Down until the processor has seen its lock's session go.
    group::wait_for("the lock's session lost", 60, || async {
        p.stderr_lines().iter().any(|l| l.contains(LOCK_LOST))
    })
    .await;
    pg.start_server();
    readyz_becomes(metrics, 200).await;

    wait_for_the_end(&mut nats, &pool, &expected, 20_000).await;
    // What the lost run held came from a consumer created again at the database's position:
    // delivered once, in order.
    assert_eq!(redeliveries(metrics).await, 0.0);
    let out = p.stop().await;
    server.assert_no_secret(&out);
    out.assert_exit(0);
    assert!(out.stderr.contains(CREATED_AGAIN), "{}", out.stderr);
    assert_exact(&pool, &expected).await;
    assert_position(&pool, GROUP, 20_001).await;
}

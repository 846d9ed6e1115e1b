//! The binary reading RabbitMQ queues (`--source amqp://…`), against the RabbitMQ node that
//! scripts/test.sh starts for the run (AMQP_URL; AMQP_CTL runs `rabbitmqctl` on it): exactly
//! once under duplicates, bad input, a SIGKILL, a broker restart and a standby's takeover, and
//! the settings refused at start.

use std::time::{Duration, Instant};

use batch_inbox::internals::amqp::declare;
use batch_inbox::QueueType;
use batch_inbox_tools::amqp_publish::publish;
use batch_inbox_tools::generate::{generate, Expected, GeneratorSettings, Record};
use batch_inbox_tools::verify::{differences, observe};
use deadpool_postgres::Pool;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Connection, ConnectionProperties};

use crate::common::child::Running;
use crate::common::{fresh_db, group};

/// The suite's RabbitMQ node.
fn amqp_url() -> String {
    std::env::var("AMQP_URL").expect("AMQP_URL: run the tests through scripts/test.sh")
}

/// A queue name of this test run's own.
fn queue(name: &str) -> String {
    format!("bi-{name}-{}", std::process::id())
}

/// The input of a test: generated records with duplicates, bad input and overdrafts.
fn input(messages: u64, seed: u64) -> (Vec<Record>, Expected) {
    generate(GeneratorSettings {
        messages,
        accounts: 200,
        duplicate_ratio: 0.15,
        bad_ratio: 0.02,
        seed,
        ..GeneratorSettings::default()
    })
}

/// The binary reading `queues` into the database at `db` (a URL) with `extra` flags.
fn spawn(db: &str, queues: &[&str], extra: &[&str]) -> Running {
    let url = amqp_url();
    let mut args = vec!["run", "--source", url.as_str(), "--log-interval", "0"];
    for q in queues {
        args.extend(["--queue", q]);
    }
    args.extend(extra);
    Running::spawn(&args, &[("DATABASE_URL", db)])
}

async fn assert_exact(pool: &Pool, expected: &Expected) {
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, expected), Vec::<String>::new());
}

/// The model's state after deliveries went back to the queue unacknowledged (a kill, a broker
/// restart): every id applied once and the balances exact; every bad record dead-lettered, and
/// one whose dead letter committed before its acknowledgement was lost dead-lettered once per
/// delivery (a queue gives it a new position; module `source`). A bad record with a valid id
/// has one dead letter per id at least and no id beyond the model's.
async fn assert_exact_but_repeated_dead_letters(pool: &Pool, expected: &Expected) {
    let client = pool.get().await.unwrap();
    let observed = observe(&**client).await.unwrap();
    assert_eq!(observed.inbox, expected.new);
    assert_eq!(observed.balances, expected.balances);
    for (reason, n) in &expected.dead_letters {
        let got = observed.dead_letters.get(reason).copied().unwrap_or(0);
        assert!(got >= *n, "{reason}: {got} dead letters, {n} bad records");
        if matches!(
            reason.as_str(),
            "empty_payload" | "invalid_payload" | "insufficient_funds"
        ) {
            let ids: i64 = client
                .query_one(
                    "SELECT count(DISTINCT message_id) FROM dead_letters WHERE reason = $1",
                    &[reason],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(ids as u64, *n, "{reason}: distinct ids");
        }
    }
    assert_eq!(
        observed.dead_letters.keys().collect::<Vec<_>>(),
        expected.dead_letters.keys().collect::<Vec<_>>()
    );
}

/// Waits until the inbox holds at least `n` rows (at most 60 s).
async fn wait_for_rows(pool: &Pool, n: u64) {
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

/// Waits until the database holds every id and balance of the model and at least the model's
/// dead letters of each reason (at most 120 s).
async fn wait_for_all(pool: &Pool, expected: &Expected) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let o = observe(&**pool.get().await.unwrap()).await.unwrap();
        let letters = expected
            .dead_letters
            .iter()
            .all(|(r, n)| o.dead_letters.get(r).is_some_and(|got| got >= n));
        if o.inbox == expected.new && o.balances == expected.balances && letters {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not the model's state: {} of {} ids, dead letters {:?}",
            o.inbox,
            expected.new,
            o.dead_letters
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `rabbitmqctl` with `args` on the suite's node (AMQP_CTL).
fn ctl(args: &[&str]) {
    let ctl = std::env::var("AMQP_CTL").expect("AMQP_CTL: run the tests through scripts/test.sh");
    let status = std::process::Command::new(ctl)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("rabbitmqctl runs");
    assert!(status.success(), "rabbitmqctl {args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_queues_are_applied_exactly_once_and_a_republish_adds_nothing() {
    let _node = NODE.lock().await;
    let (q1, q2) = (queue("once-a"), queue("once-b"));
    let (db, pool) = fresh_db("amqp_once").await;
    let (records, expected) = input(20_000, 7);
    assert!(expected.duplicates > 0 && expected.dead_letters.len() >= 4);
    let sent = publish(
        &amqp_url(),
        &[q1.clone(), q2.clone()],
        QueueType::Classic,
        records.clone(),
    )
    .await
    .unwrap();
    assert_eq!(sent, 20_000);

    let out = spawn(&db, &[&q1, &q2], &["--exit-on-eof"])
        .wait(Duration::from_secs(120))
        .await;
    out.assert_exit(0);
    assert!(out.stdout.contains("records 20000 "), "{}", out.stdout);
    assert_positions(&pool, &[&q1, &q2], 20_000).await;
    assert_exact(&pool, &expected).await;

    // Every record published once more (a publisher that resends all): nothing is applied again,
    // and every one is acknowledged (the queues end empty, the run exits).
    publish(
        &amqp_url(),
        &[q1.clone(), q2.clone()],
        QueueType::Classic,
        records,
    )
    .await
    .unwrap();
    let out = spawn(&db, &[&q1, &q2], &["--exit-on-eof"])
        .wait(Duration::from_secs(120))
        .await;
    out.assert_exit(0);
    assert!(
        out.stdout.contains("records 20000 new 0 "),
        "{}",
        out.stdout
    );
    // The bad records published again are new messages, each dead-lettered once more; nothing
    // else changed.
    let again = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(again.inbox, expected.new);
    assert_eq!(again.balances, expected.balances);
    for (reason, n) in &expected.dead_letters {
        let twice = match reason.as_str() {
            "insufficient_funds" => *n, // a rejected id is in the inbox: skipped
            _ => 2 * n,
        };
        assert_eq!(again.dead_letters.get(reason), Some(&twice), "{reason}");
    }
    assert_positions(&pool, &[&q1, &q2], 40_000).await;
}

/// The positions the database holds for `queues` (reader `batch-inbox`) add up to `total`
/// deliveries numbered.
async fn assert_positions(pool: &Pool, queues: &[&str], total: i64) {
    let client = pool.get().await.unwrap();
    let mut sum = 0i64;
    for q in queues {
        let row = client
            .query_one(
                "SELECT next_offset FROM consumer_offsets WHERE group_id = 'batch-inbox' \
                 AND topic = $1 AND partition = 0",
                &[q],
            )
            .await
            .unwrap();
        sum += row.get::<_, i64>(0);
    }
    assert_eq!(sum, total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_in_the_middle_applies_nothing_twice() {
    let _node = NODE.lock().await;
    let q = queue("kill");
    let (db, pool) = fresh_db("amqp_kill").await;
    let (records, expected) = input(60_000, 11);
    publish(
        &amqp_url(),
        std::slice::from_ref(&q),
        QueueType::Classic,
        records,
    )
    .await
    .unwrap();
    // Small batches, so that the kill lands between commits with deliveries unacknowledged.
    let child = spawn(&db, &[&q], &["--batch-size", "100"]);
    wait_for_rows(&pool, expected.new / 3).await;
    let killed = child.kill().await;
    assert_eq!(killed.code, None, "{}", killed.stderr);
    let applied = group::inbox_rows(&pool).await;
    assert!(applied < expected.new, "the kill came too late: {applied}");

    let out = spawn(&db, &[&q], &["--exit-on-eof"])
        .wait(Duration::from_secs(120))
        .await;
    out.assert_exit(0);
    assert_exact_but_repeated_dead_letters(&pool, &expected).await;
}

/// Restarts the node's RabbitMQ application in the middle of a run, for a queue of `kind`.
async fn broker_restart(name: &str, kind: QueueType) {
    let q = queue(name);
    let (db, pool) = fresh_db(name).await;
    let (records, expected) = input(40_000, 13);
    publish(&amqp_url(), std::slice::from_ref(&q), kind, records)
        .await
        .unwrap();
    let child = spawn(
        &db,
        &[&q],
        &[
            "--queue-type",
            &kind.to_string(),
            "--batch-size",
            "200",
            "--exit-on-eof",
        ],
    );
    wait_for_rows(&pool, expected.new / 4).await;
    // Held in the middle whatever the machine's speed: the ledger's table renamed away stalls
    // the queue (the rest of it cannot be applied) while the broker restarts.
    let client = pool.get().await.unwrap();
    client
        .batch_execute("ALTER TABLE balances RENAME TO balances_away")
        .await
        .unwrap();
    let applied = group::inbox_rows(&pool).await;
    assert!(
        applied < expected.new,
        "finished before the restart: {applied}"
    );
    ctl(&["stop_app"]);
    ctl(&["start_app"]);
    client
        .batch_execute("ALTER TABLE balances_away RENAME TO balances")
        .await
        .unwrap();
    let out = child.wait(Duration::from_secs(180)).await;
    out.assert_exit(0);
    assert!(
        out.stderr.contains("channel closed") || out.stderr.contains("cannot read the queue"),
        "the restart went unnoticed: {}",
        out.stderr
    );
    assert_exact_but_repeated_dead_letters(&pool, &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_applies_a_classic_queue_exactly_once() {
    let _node = NODE.lock().await;
    broker_restart("amqp_restart_classic", QueueType::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_applies_a_quorum_queue_exactly_once() {
    let _node = NODE.lock().await;
    broker_restart("amqp_restart_quorum", QueueType::Quorum).await;
}

/// The tests of this file, one at a time: some restart the node or shorten its consumer_timeout,
/// and the exact counts of the others hold only without a redelivery they did not cause.
static NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_active_instance_dies() {
    let _node = NODE.lock().await;
    let q = queue("standby");
    let (db, pool) = fresh_db("amqp_standby").await;
    let (records, expected) = input(60_000, 17);
    // Two instances on one queue (single active consumer): one reads, the other waits.
    let flags = ["--metrics-addr", "127.0.0.1:0", "--batch-size", "100"];
    let mut first = spawn(&db, &[&q], &flags);
    let first_metrics = first.metrics_addr().await;
    let mut second = spawn(&db, &[&q], &flags);
    let second_metrics = second.metrics_addr().await;
    publish(
        &amqp_url(),
        std::slice::from_ref(&q),
        QueueType::Classic,
        records,
    )
    .await
    .unwrap();
    wait_for_rows(&pool, expected.new / 4).await;
    let consumed = |body: &str| metric(body, "batch_inbox_messages_consumed");
    let (_, a) = crate::common::http::get(first_metrics, "/metrics").await;
    let (_, b) = crate::common::http::get(second_metrics, "/metrics").await;
    // Exactly one of them has read anything.
    assert!(
        (consumed(&a) > 0.0) != (consumed(&b) > 0.0),
        "{} and {}",
        consumed(&a),
        consumed(&b)
    );
    let (active, standby) = match consumed(&a) > 0.0 {
        true => (first, second),
        false => (second, first),
    };
    active.kill().await;
    let applied = group::inbox_rows(&pool).await;
    assert!(applied < expected.new, "the kill came too late: {applied}");
    wait_for_all(&pool, &expected).await;
    let out = standby.stop().await;
    out.assert_exit(0);
    assert_exact_but_repeated_dead_letters(&pool, &expected).await;
}

/// The sum of a metric's samples in an exposition.
fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_break_the_guarantee_are_refused_and_secrets_never_shown() {
    let _node = NODE.lock().await;
    let (db, _) = fresh_db("amqp_refused").await;
    let q = queue("refused");
    // Ids from positions: a redelivery gets a new number.
    let out = spawn(&db, &[&q], &["--id-from", "position"])
        .wait(Duration::from_secs(60))
        .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--id-from position"), "{}", out.stderr);

    // A queue that exists with a message TTL (it drops messages while a partition stalls).
    let ttl = queue("ttl");
    let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-message-ttl"),
        AMQPValue::LongInt(60_000),
    );
    let options = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(ShortString::from(ttl.as_str()), options, args)
        .await
        .unwrap();
    let out = spawn(&db, &[&ttl], &[]).wait(Duration::from_secs(60)).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("inequivalent arg"), "{}", out.stderr);

    // A queue of the other type.
    let classic = queue("classic");
    declare(&channel, &classic, QueueType::Classic)
        .await
        .unwrap();
    let out = spawn(&db, &[&classic], &["--queue-type", "quorum"])
        .wait(Duration::from_secs(60))
        .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("x-queue-type"), "{}", out.stderr);

    // A refused login ends the start at once, without the password.
    let url = amqp_url().replace("guest:guest@", "guest:Sup3rS3cretPw@");
    let out = Running::spawn(
        &["run", "--source", &url, "--queue", &q],
        &[("DATABASE_URL", &db)],
    )
    .wait(Duration::from_secs(60))
    .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("refused"), "{}", out.stderr);
    assert!(!out.stderr.contains("Sup3rS3cretPw") && !out.stdout.contains("Sup3rS3cretPw"));

    // --queue without --source, and --source that is not RabbitMQ's (the value never shown).
    let out = Running::spawn(&["run", "--queue", &q], &[])
        .wait(Duration::from_secs(30))
        .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--source"), "{}", out.stderr);
    let out = Running::spawn(
        &[
            "run",
            "--source",
            "kafka://u:Sup3rS3cretPw@h",
            "--queue",
            &q,
        ],
        &[],
    )
    .wait(Duration::from_secs(30))
    .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(!out.stderr.contains("Sup3rS3cretPw"), "{}", out.stderr);
    let _ = connection.close(200, ShortString::from("done")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_past_the_consumer_timeout_holds_the_queue_and_resumes_exactly_once() {
    let _node = NODE.lock().await;
    let q = queue("stall");
    let (db, pool) = fresh_db("amqp_stall").await;
    let (records, expected) = input(20_000, 19);
    publish(
        &amqp_url(),
        std::slice::from_ref(&q),
        QueueType::Classic,
        records,
    )
    .await
    .unwrap();
    // RabbitMQ closes a channel whose delivery stays unacknowledged past consumer_timeout
    // (node-wide on 3.10, read when a channel opens): 2 s on the channels opened meanwhile.
    let _timeout = ConsumerTimeout::set(2000);
    let mut child = spawn(
        &db,
        &[&q],
        &["--batch-size", "100", "--metrics-addr", "127.0.0.1:0"],
    );
    let metrics = child.metrics_addr().await;
    wait_for_rows(&pool, expected.new / 4).await;
    // An operator's fault, not the messages': the ledger's table renamed away.
    let client = pool.get().await.unwrap();
    client
        .batch_execute("ALTER TABLE balances RENAME TO balances_away")
        .await
        .unwrap();
    // The queue stalls: nothing applied, nothing dead-lettered, for longer than the timeout.
    let stalled_at = group::inbox_rows(&pool).await;
    let letters = || async {
        let row = client
            .query_one("SELECT count(*) FROM dead_letters", &[])
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    let letters_at = letters().await;
    crate::common::http::poll(Duration::from_secs(30), "the stall gauge", || async {
        let (_, body) = crate::common::http::get(metrics, "/metrics").await;
        (metric(&body, "batch_inbox_stalled{") >= 1.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(group::inbox_rows(&pool).await, stalled_at);
    assert_eq!(letters().await, letters_at);
    client
        .batch_execute("ALTER TABLE balances_away RENAME TO balances")
        .await
        .unwrap();
    wait_for_all(&pool, &expected).await;
    let out = child.stop().await;
    out.assert_exit(0);
    assert!(
        out.stderr.contains("channel closed"),
        "the consumer_timeout did not close the channel: {}",
        out.stderr
    );
    assert_exact_but_repeated_dead_letters(&pool, &expected).await;
}

/// The node's consumer_timeout, set for a test and back to RabbitMQ's default when it ends.
struct ConsumerTimeout;

impl ConsumerTimeout {
    fn set(ms: u64) -> Self {
        ctl(&[
            "eval",
            &format!("application:set_env(rabbit, consumer_timeout, {ms})."),
        ]);
        ConsumerTimeout
    }
}

impl Drop for ConsumerTimeout {
    fn drop(&mut self) {
        ctl(&[
            "eval",
            "application:set_env(rabbit, consumer_timeout, 1800000).",
        ]);
    }
}

//! The binary reading RabbitMQ queues (`--source amqp://…`), against the RabbitMQ node that
//! scripts/test.sh starts for the run (AMQP_URL; AMQP_CTL runs `rabbitmqctl` on it): exactly
//! once under duplicates, bad input, a SIGKILL, a broker restart and a standby's takeover, and
//! the settings refused at start.

use std::time::Duration;

use batch_inbox::internals::amqp::declare;
use batch_inbox::QueueType;
use batch_inbox_tools::amqp_publish::publish;
use batch_inbox_tools::generate::Expected;
use batch_inbox_tools::verify::observe;
use deadpool_postgres::Pool;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Connection, ConnectionProperties};

use crate::common::child::Running;
use crate::common::ledger_checks::{
    assert_exact, assert_exact_after_a_republish, dead_letter_rows, input, metric, readyz_becomes,
    stored_position, wait_for_rows, wait_for_state,
};
use crate::common::{fresh_db, group};

/// The suite's RabbitMQ node.
fn amqp_url() -> String {
    std::env::var("AMQP_URL").expect("AMQP_URL: run the tests through scripts/test.sh")
}

/// A queue name of this test run's own.
fn queue(name: &str) -> String {
    format!("bi-{name}-{}", std::process::id())
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

/// Waits until the database holds every id and balance of the model and at least the model's
/// dead letters of each reason (at most 120 s).
async fn wait_for_all(pool: &Pool, expected: &Expected) {
    wait_for_state(pool, |o| {
        let letters = expected
            .dead_letters
            .iter()
            .all(|(r, n)| o.dead_letters.get(r).is_some_and(|got| got >= n));
        match o.inbox == expected.new && o.balances == expected.balances && letters {
            true => Ok(()),
            false => Err(format!(
                "{} of {} ids, dead letters {:?}",
                o.inbox, expected.new, o.dead_letters
            )),
        }
    })
    .await
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
    assert_exact_after_a_republish(&pool, &expected).await;
    assert_positions(&pool, &[&q1, &q2], 40_000).await;
}

/// The positions the database holds for `queues` (reader `batch-inbox`) add up to `total`
/// deliveries numbered.
async fn assert_positions(pool: &Pool, queues: &[&str], total: i64) {
    let mut sum = 0i64;
    for q in queues {
        sum += stored_position(pool, "batch-inbox", q)
            .await
            .unwrap_or_else(|| panic!("no position of {q}"));
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
    let (active, standby, standby_metrics) = match consumed(&a) > 0.0 {
        true => (first, second, second_metrics),
        false => (second, first, first_metrics),
    };
    active.kill().await;
    let applied = group::inbox_rows(&pool).await;
    assert!(applied < expected.new, "the kill came too late: {applied}");
    wait_for_all(&pool, &expected).await;
    // What the dead instance held unacknowledged came to the standby marked redelivered.
    let (_, body) = crate::common::http::get(standby_metrics, "/metrics").await;
    assert!(
        metric(&body, "batch_inbox_redeliveries_total") > 0.0,
        "{body}"
    );
    let out = standby.stop().await;
    out.assert_exit(0);
    assert_exact_but_repeated_dead_letters(&pool, &expected).await;
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

    // --print-config shows the source with its password masked.
    let out = Running::spawn(
        &[
            "run",
            "--print-config",
            "--source",
            "amqps://app:Sup3rS3cretPw@broker:5671/%2f",
            "--queue",
            &q,
        ],
        &[("DATABASE_URL", &db)],
    )
    .wait(Duration::from_secs(30))
    .await;
    out.assert_exit(0);
    assert!(
        out.stdout
            .contains("source = \"amqps://app:***@broker:5671/%2f\""),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("Sup3rS3cretPw") && !out.stderr.contains("Sup3rS3cretPw"));
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
    let letters_at = dead_letter_rows(&pool).await;
    crate::common::http::poll(Duration::from_secs(30), "the stall gauge", || async {
        let (_, body) = crate::common::http::get(metrics, "/metrics").await;
        (metric(&body, "batch_inbox_stalled{") >= 1.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(group::inbox_rows(&pool).await, stalled_at);
    assert_eq!(dead_letter_rows(&pool).await, letters_at);
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

/// A publisher that writes AMQP 0-9-1 frames itself, so that a message can carry what a client
/// library refuses to send (short strings that are not UTF-8, header types AMQP does not define):
/// RabbitMQ passes such bytes on, and a consumer must not stop on them.
mod raw {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// One message's property list (flags first) and body.
    pub struct Message {
        pub properties: Vec<u8>,
        pub body: Vec<u8>,
    }

    fn short(out: &mut Vec<u8>, s: &[u8]) {
        out.push(u8::try_from(s.len()).unwrap());
        out.extend_from_slice(s);
    }

    /// The property list: `message_id` (any bytes) and a headers table's raw entries.
    pub fn properties(message_id: Option<&[u8]>, table: Option<&[u8]>) -> Vec<u8> {
        let flags = message_id.map_or(0u16, |_| 1 << 7) | table.map_or(0, |_| 1 << 13);
        let mut p = flags.to_be_bytes().to_vec();
        if let Some(t) = table {
            p.extend_from_slice(&u32::try_from(t.len()).unwrap().to_be_bytes());
            p.extend_from_slice(t);
        }
        if let Some(id) = message_id {
            short(&mut p, id);
        }
        p
    }

    /// A header table entry: `name` (any bytes) of `kind` with `value`'s bytes as they are.
    pub fn entry(name: &[u8], kind: u8, value: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        short(&mut e, name);
        e.push(kind);
        e.extend_from_slice(value);
        e
    }

    fn send(s: &mut TcpStream, kind: u8, channel: u16, payload: &[u8]) {
        let mut f = vec![kind];
        f.extend_from_slice(&channel.to_be_bytes());
        f.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        f.extend_from_slice(payload);
        f.push(0xCE);
        s.write_all(&f).unwrap();
    }

    fn method(class: u16, id: u16, args: &[u8]) -> Vec<u8> {
        let mut m = class.to_be_bytes().to_vec();
        m.extend_from_slice(&id.to_be_bytes());
        m.extend_from_slice(args);
        m
    }

    /// The next frame: its type and payload.
    fn receive(s: &mut TcpStream) -> (u8, Vec<u8>) {
        let mut head = [0u8; 7];
        s.read_exact(&mut head).unwrap();
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
        let mut payload = vec![0u8; size + 1];
        s.read_exact(&mut payload).unwrap();
        payload.pop();
        (head[0], payload)
    }

    /// The next method frame (heartbeats skipped) is `class`.`id`, or the test fails with what
    /// the broker said.
    fn expect(s: &mut TcpStream, class: u16, id: u16) -> Vec<u8> {
        loop {
            let (kind, payload) = receive(s);
            if kind == 8 {
                continue;
            }
            let got = (
                u16::from_be_bytes([payload[0], payload[1]]),
                u16::from_be_bytes([payload[2], payload[3]]),
            );
            assert_eq!(
                got,
                (class, id),
                "the broker answered {}",
                String::from_utf8_lossy(&payload)
            );
            return payload;
        }
    }

    /// Publishes `messages` to `queue` through the default exchange with publisher confirms,
    /// and returns once the broker confirmed them all.
    pub fn publish(url: &str, queue: &str, messages: &[Message]) {
        let uri: lapin::uri::AMQPUri = url.parse().unwrap();
        let a = &uri.authority;
        let mut s = TcpStream::connect((a.host.as_str(), a.port)).unwrap();
        s.write_all(b"AMQP\x00\x00\x09\x01").unwrap();
        expect(&mut s, 10, 10);
        let mut args = 0u32.to_be_bytes().to_vec(); // client properties: none
        short(&mut args, b"PLAIN");
        let login = format!("\0{}\0{}", a.userinfo.username, a.userinfo.password);
        args.extend_from_slice(&u32::try_from(login.len()).unwrap().to_be_bytes());
        args.extend_from_slice(login.as_bytes());
        short(&mut args, b"en_US");
        send(&mut s, 1, 0, &method(10, 11, &args));
        let tune = expect(&mut s, 10, 30);
        let mut args = tune[4..6].to_vec(); // channel-max as offered
        args.extend_from_slice(&tune[6..10]); // frame-max as offered
        args.extend_from_slice(&0u16.to_be_bytes()); // no heartbeat
        send(&mut s, 1, 0, &method(10, 31, &args));
        let mut args = Vec::new();
        short(&mut args, uri.vhost.as_bytes());
        args.extend_from_slice(&[0, 0]);
        send(&mut s, 1, 0, &method(10, 40, &args));
        expect(&mut s, 10, 41);
        send(&mut s, 1, 1, &method(20, 10, &[0]));
        expect(&mut s, 20, 11);
        send(&mut s, 1, 1, &method(85, 10, &[0]));
        expect(&mut s, 85, 11);
        for m in messages {
            let mut args = vec![0, 0, 0];
            short(&mut args, queue.as_bytes());
            args.push(0);
            args[2] = 0; // exchange "" (its length byte)
            send(&mut s, 1, 1, &method(60, 40, &args));
            let mut header = vec![0, 60, 0, 0];
            header.extend_from_slice(&(m.body.len() as u64).to_be_bytes());
            header.extend_from_slice(&m.properties);
            send(&mut s, 2, 1, &header);
            if !m.body.is_empty() {
                send(&mut s, 3, 1, &m.body);
            }
        }
        let last = messages.len() as u64;
        loop {
            let ack = expect(&mut s, 60, 80);
            let tag = u64::from_be_bytes(ack[4..12].try_into().unwrap());
            if tag == last {
                break;
            }
        }
        send(&mut s, 1, 0, &method(10, 50, &[0, 200, 0, 0, 0, 0, 0]));
        expect(&mut s, 10, 51);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_the_client_cannot_read_become_records_or_dead_letters_never_a_stopped_queue() {
    let _node = NODE.lock().await;
    let q = queue("bytes");
    let (db, pool) = fresh_db("amqp_bytes").await;
    let (records, mut expected) = input(600, 11);
    // The queue exists as the processor declares it.
    let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    declare(
        &connection.create_channel().await.unwrap(),
        &q,
        QueueType::Classic,
    )
    .await
    .unwrap();
    let _ = connection.close(200, ShortString::from("declared")).await;

    // Every record as it is, except every fifth, which also carries a header named with bytes
    // that are not UTF-8, at the top or in a nested table; and ten records more whose message_id
    // is not UTF-8 (dead letters: invalid_id). (RabbitMQ itself refuses a header of a type AMQP
    // does not define: it closes the publisher's connection.)
    let mut nested = raw::entry(b"\xff", b'I', &1i32.to_be_bytes());
    nested.splice(0..0, u32::try_from(nested.len()).unwrap().to_be_bytes());
    let mut messages = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let mut table = raw::entry(b"n", b'I', &7i32.to_be_bytes());
        match i % 15 {
            0 => table.extend(raw::entry(b"h\xff\xfe", b'S', b"\x00\x00\x00\x01v")),
            5 => table.extend(raw::entry(b"nest", b'F', &nested)),
            10 => {
                table.extend(raw::entry(b"\xc3\x28", b'S', b"\x00\x00\x00\x00"));
                table.extend(raw::entry(b"\x80", b'V', b""));
            }
            _ => {}
        }
        messages.push(raw::Message {
            properties: raw::properties(r.id.as_deref().map(str::as_bytes), Some(&table)),
            body: r.value.clone().unwrap_or_default(),
        });
    }
    for i in 0..10u8 {
        messages.push(raw::Message {
            properties: raw::properties(Some(&[0xff, 0xfe, i]), None),
            body: records[0].value.clone().unwrap_or_default(),
        });
    }
    *expected
        .dead_letters
        .entry("invalid_id".to_owned())
        .or_default() += 10;
    let url = amqp_url();
    let queue_name = q.clone();
    tokio::task::spawn_blocking(move || raw::publish(&url, &queue_name, &messages))
        .await
        .unwrap();

    let out = spawn(&db, &[&q], &["--exit-on-eof"])
        .wait(Duration::from_secs(120))
        .await;
    out.assert_exit(0);
    assert!(out.stdout.contains("records 610 "), "{}", out.stdout);
    assert_positions(&pool, &[&q], 610).await;
    assert_exact(&pool, &expected).await;
    // Each of the ten ids not UTF-8 dead-lettered once, its bytes exactly.
    let client = pool.get().await.unwrap();
    let mut keys: Vec<Vec<u8>> = client
        .query(
            "SELECT key FROM dead_letters WHERE reason = 'invalid_id' AND topic = $1 \
             AND substring(key FROM 1 FOR 2) = '\\xfffe'::bytea",
            &[&q],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    keys.sort();
    let sent: Vec<Vec<u8>> = (0..10u8).map(|i| vec![0xff, 0xfe, i]).collect();
    assert_eq!(keys, sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_crash_holds_the_queue_and_readyz_then_resumes_exactly_once() {
    let _node = NODE.lock().await;
    let pg = crate::common::postgres::PrivatePostgres::start();
    let (url, pool) = pg.ledger_db("amqp_pg").await;
    let q = queue("pg-crash");
    let (records, expected) = input(30_000, 19);

    let flags = ["--metrics-addr", "127.0.0.1:0", "--batch-size", "100"];
    let mut p = spawn(&url, &[&q], &flags);
    let metrics = p.metrics_addr().await;
    // Ready with the queue's consumer waiting, before any message.
    readyz_becomes(metrics, 200).await;
    publish(
        &amqp_url(),
        std::slice::from_ref(&q),
        QueueType::Classic,
        records,
    )
    .await
    .unwrap();
    wait_for_rows(&pool, expected.new / 5).await;
    pg.stop_immediate();
    let body = readyz_becomes(metrics, 503).await;
    assert_eq!(body, "not ready: database\n");
    let applied_before = {
        pg.start_server();
        readyz_becomes(metrics, 200).await;
        group::inbox_rows(&pool).await
    };
    assert!(
        applied_before < expected.new,
        "the crash came too late: {applied_before}"
    );
    wait_for_all(&pool, &expected).await;
    let (_, body) = crate::common::http::get(metrics, "/metrics").await;
    // The batch in flight was held, not given back: nothing came again, unless the crash
    // landed between a COMMIT and its answer (the next write then finds the database ahead,
    // and the channel ends to be numbered from it again: a rewind, counted).
    if metric(&body, "batch_inbox_positions_rewound_total") == 0.0 {
        assert_eq!(
            metric(&body, "batch_inbox_redeliveries_total"),
            0.0,
            "{body}"
        );
    }
    let out = p.stop().await;
    out.assert_exit(0);
    assert_exact(&pool, &expected).await;
    assert_positions(&pool, &[&q], 30_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_in_the_middle_of_batches_apply_nothing_twice() {
    let _node = NODE.lock().await;
    let q = queue("cut");
    let (db, pool) = fresh_db("amqp_cut").await;
    // Enough input that both cuts land in the middle even on a fast machine (rabbitmqctl takes
    // about a second to start).
    let (records, expected) = input(150_000, 23);
    publish(
        &amqp_url(),
        std::slice::from_ref(&q),
        QueueType::Classic,
        records,
    )
    .await
    .unwrap();
    let flags = ["--metrics-addr", "127.0.0.1:0", "--batch-size", "100"];
    let mut p = spawn(&db, &[&q], &flags);
    let metrics = p.metrics_addr().await;
    // The broker cuts every connection twice while batches are in flight: each time the
    // channel's unacknowledged deliveries go back to the queue, and the processor connects again.
    for share in [8, 4] {
        wait_for_rows(&pool, expected.new / share).await;
        ctl(&["close_all_connections", "cut by the test"]);
    }
    let applied = group::inbox_rows(&pool).await;
    assert!(applied < expected.new, "the cuts came too late: {applied}");
    wait_for_all(&pool, &expected).await;
    let (_, body) = crate::common::http::get(metrics, "/metrics").await;
    assert!(
        metric(&body, "batch_inbox_redeliveries_total") > 0.0,
        "{body}"
    );
    let out = p.stop().await;
    out.assert_exit(0);
    assert_exact_but_repeated_dead_letters(&pool, &expected).await;
}

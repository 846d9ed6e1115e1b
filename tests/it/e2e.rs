//! The `batch-inbox` binary as a separate process against a real broker (Apache Kafka).

use crate::common;
use crate::common::broker;
use crate::common::group::{self, OffsetReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use batch_inbox_tools::generate::Expected;
use batch_inbox_tools::verify::{differences, observe};
use broker::Broker;
use common::*;

fn cli(db_url: &str, brokers: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_batch-inbox"))
        .args(args)
        .env("DATABASE_URL", db_url)
        .env("KAFKA_BROKERS", brokers)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the binary runs")
}

fn ok(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Produces 20,000 generated records (duplicates, bad input, overdrafts) to a new 4-partition topic.
async fn produce(broker: &Broker, topic: &str) -> Expected {
    use batch_inbox_tools::generate::{generate, GeneratorSettings};
    batch_inbox_tools::produce::ensure_topic(&broker.addr, topic, 4)
        .await
        .unwrap();
    let (records, expected) = generate(GeneratorSettings {
        messages: 20_000,
        accounts: 300,
        duplicate_ratio: 0.15,
        bad_ratio: 0.02,
        ..GeneratorSettings::default()
    });
    let producer = batch_inbox_tools::produce::producer(&broker.addr, &[]).unwrap();
    batch_inbox_tools::produce::send_all(&producer, topic, records)
        .await
        .unwrap();
    expected
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_applies_a_real_broker_topic_exactly_once() {
    let broker = Broker::start();
    let (url, pool) = fresh_db("e2e").await;
    let topic = broker.topic("e2e");
    let expected = produce(&broker, &topic).await;
    assert!(expected.duplicates > 0 && expected.dead_letters.len() >= 5);

    let out = ok(cli(
        &url,
        &broker.addr,
        &[
            "run",
            "--topic",
            &topic,
            "--group",
            &Broker::group(&topic, "e2e"),
            "--exit-on-eof",
        ],
    ));
    assert!(out.contains("records 20000 "), "{out}");
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, &expected), Vec::<String>::new());

    // The per-message baseline, replaying the topic in another group, adds nothing.
    let out = ok(cli(
        &url,
        &broker.addr,
        &[
            "run",
            "--topic",
            &topic,
            "--group",
            &Broker::group(&topic, "e2e-replay"),
            "--mode",
            "per-message",
            "--exit-on-eof",
        ],
    ));
    assert!(out.contains("records 20000 new 0 "), "{out}");
    let after = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(after, observed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_batches_and_commits_offsets() {
    let broker = Broker::start();
    let (url, pool) = fresh_db("e2e_sigterm").await;
    let topic = broker.topic("sigterm");
    let expected = produce(&broker, &topic).await;
    let group = Broker::group(&topic, "g");
    let reader = OffsetReader::new(&broker.addr, &group, &topic, 4);
    let ends = reader.ends();
    assert_eq!(ends.iter().sum::<i64>(), 20_000);

    // librdkafka's own commits off (allowed with offsets in the database, the default): only the
    // processor's commit at shutdown can move Kafka's offsets. With them on, the periodic commit
    // and the consumer's close would commit the stored offsets too, and hide a missing one.
    let child = Command::new(env!("CARGO_BIN_EXE_batch-inbox"))
        .args(["run", "--topic", &topic, "--group", &group])
        .args(["-X", "enable.auto.commit=false"])
        .env("DATABASE_URL", &url)
        .env("KAFKA_BROKERS", &broker.addr)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the database to hold every id (a condition, polled, with a deadline).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = group::inbox_rows(&pool).await;
        if n == expected.new {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "inbox stuck at {n} of {}",
            expected.new
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        reader.committed(),
        Some(vec![-1; 4]),
        "nothing committed to Kafka before the shutdown"
    );
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let out = ok(child.wait_with_output().unwrap());
    assert!(out.contains("records 20000 "), "{out}");

    // Kafka's committed offsets for the group, read without joining it: every partition's end,
    // as in the database.
    assert_eq!(group::db_offsets(&pool, &group, 4).await, ends);
    assert_eq!(reader.committed(), Some(ends));
}

//! Outages under load: PostgreSQL crashes and comes back, Kafka offset commits fail, the broker
//! goes down and answers slowly. Nothing is lost, nothing is applied twice, no offset is
//! committed past what the database holds, committed offsets never go backwards, and the lag
//! returns to 0.

use crate::common;
use crate::common::group;
use crate::common::postgres;
use std::time::Duration;

use batch_inbox::db;
use batch_inbox::Mode;
use batch_inbox_tools::generate::{generate, Expected, GeneratorSettings, Record};
use batch_inbox_tools::verify::{differences, observe};
use common::*;
use deadpool_postgres::Pool;
use group::*;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

fn input(messages: u64, seed: u64) -> (Vec<Record>, Expected) {
    generate(GeneratorSettings {
        messages,
        accounts: 50,
        seed,
        ..GeneratorSettings::default()
    })
}

async fn assert_exact(pool: &Pool, expected: &Expected) {
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, expected), Vec::<String>::new());
}

/// Kafka's committed offset never exceeds the one the database holds for a partition.
fn assert_kafka_not_ahead(kafka: &[i64], db: &[i64]) {
    for (p, (k, d)) in kafka.iter().zip(db).enumerate() {
        assert!(
            k <= d,
            "partition {p}: Kafka committed {k}, database holds {d}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crashing_under_load_loses_nothing_and_commits_no_offset_while_down() {
    let pg = postgres::PrivatePostgres::start();
    let admin = db::connect(&pg.url("postgres"), 1).await.unwrap();
    let name = db_name("pg_crash");
    admin
        .get()
        .await
        .unwrap()
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let pool = db::connect(&pg.url(&name), 8).await.unwrap();
    db::migrate(&pool).await.unwrap();
    batch_inbox::ledger::migrate(&pool).await.unwrap();
    let kafka = Kafka::new("pg_crash", 3);
    let (mut records, expected) = input(6_000, 11);
    let later = records.split_off(3_000);
    kafka.send_generated(records).await;

    let mut settings = kafka.settings("g");
    // Offsets stored before the crash are committed within 50 ms, long before the checks below.
    let interval = ("auto.commit.interval.ms".to_owned(), "50".to_owned());
    settings.overrides.push(interval);
    let mut cfg = config(settings, Mode::Batched, 100);
    cfg.exit_on_eof = false;
    let member = Member::start(cfg, &pool);
    let stats = member.stats.clone();
    wait_for("load", 60, || async { stats.snapshot().records >= 1_000 }).await;

    tokio::task::block_in_place(|| pg.stop_immediate());
    kafka.send_generated(later).await;
    let reader = OffsetReader::new(&kafka.brokers, "g", &kafka.topic, 3);
    // Three workers retry with backoff from 20 ms: twelve failures take each one past 300 ms,
    // six more past another 800 ms.
    let retries = stats.snapshot().retries;
    wait_for("failing attempts", 30, || async {
        stats.snapshot().retries >= retries + 12
    })
    .await;
    let down_early = reader.committed().expect("the broker is up");
    let again = stats.snapshot().retries;
    wait_for("still failing", 30, || async {
        stats.snapshot().retries >= again + 6
    })
    .await;
    let down_late = reader.committed().expect("the broker is up");
    assert_eq!(down_early, down_late, "no offset committed while down");

    tokio::task::block_in_place(|| pg.start_server());
    wait_for("every valid id applied", 90, || async {
        inbox_rows(&pool).await == expected.new
    })
    .await;
    member.stop().await;
    assert_exact(&pool, &expected).await;
    assert_kafka_not_ahead(&down_late, &db_offsets(&pool, "g", 3).await);
    assert_eq!(db_offsets(&pool, "g", 3).await, reader.ends());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_offset_commits_replay_nothing_and_never_go_backwards() {
    let (_, pool) = fresh_db("commit_fails").await;
    let kafka = Kafka::new("commit_fails", 2);
    let (records, expected) = input(2_000, 12);
    kafka.send_generated(records).await;
    let errors: Vec<RDKafkaRespErr> = (0..400)
        .map(|i| match i % 2 {
            0 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
            _ => RDKafkaRespErr::RD_KAFKA_RESP_ERR__TRANSPORT,
        })
        .collect();
    kafka
        .cluster
        .request_errors(RDKafkaApiKey::OffsetCommit, &errors);
    let reader = OffsetReader::new(&kafka.brokers, "g", &kafka.topic, 2);
    let sampler = CommittedSampler::start(OffsetReader::new(&kafka.brokers, "g", &kafka.topic, 2));

    let first = drain(config(kafka.settings("g"), Mode::Batched, 100), &pool).await;
    assert_exact(&pool, &expected).await;
    let ends = reader.ends();
    assert_eq!(
        db_offsets(&pool, "g", 2).await,
        ends,
        "the database committed"
    );
    let committed = reader.committed().unwrap();
    assert!(
        committed.iter().zip(&ends).any(|(c, e)| c < e),
        "the offset commits failed: {committed:?} of {ends:?}"
    );

    // A member that trusts Kafka's offsets alone replays, and the replay adds nothing.
    kafka
        .cluster
        .clear_request_errors(RDKafkaApiKey::OffsetCommit);
    let mut cfg = config(kafka.settings("g"), Mode::Batched, 100);
    cfg.offsets_in_db = false;
    let replay = drain(cfg, &pool).await;
    assert!(replay.records > 0, "records were read again");
    assert_eq!((replay.new, replay.dead_letters_written), (0, 0));
    assert_exact(&pool, &expected).await;
    assert_eq!(first.new, expected.new);

    // The commits now succeed: the lag returns to 0.
    wait_for("lag 0", 30, || async {
        reader.committed().unwrap() == ends
    })
    .await;
    let samples = sampler.finish();
    assert!(samples.len() > 10, "the sampler saw the runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_down_slow_and_failing_fetches_lose_nothing_and_the_lag_returns_to_zero() {
    let (_, pool) = fresh_db("broker_down").await;
    let kafka = Kafka::new("broker_down", 3);
    let (mut records, expected) = input(4_000, 13);
    let later = records.split_off(2_000);
    kafka.send_generated(records).await;
    let sampler = CommittedSampler::start(OffsetReader::new(&kafka.brokers, "g", &kafka.topic, 3));

    let mut cfg = config(kafka.settings("g"), Mode::Batched, 100);
    cfg.exit_on_eof = false;
    let member = Member::start(cfg, &pool);
    let stats = member.stats.clone();
    wait_for("load", 60, || async { stats.snapshot().records >= 500 }).await;

    kafka
        .cluster
        .broker_round_trip_time(1, Duration::from_millis(300))
        .unwrap();
    kafka.cluster.broker_down(1).unwrap();
    // The outage itself lasts 3 s; nothing is asserted on timing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    kafka.cluster.broker_up(1).unwrap();
    // Then fetches fail for a while (the leader moved, the request timed out).
    let fetch_errors: Vec<RDKafkaRespErr> = (0..20)
        .map(|i| match i % 2 {
            0 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            _ => RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        })
        .collect();
    kafka
        .cluster
        .request_errors(RDKafkaApiKey::Fetch, &fetch_errors);
    kafka.send_generated(later).await;
    wait_for("every valid id applied", 120, || async {
        inbox_rows(&pool).await == expected.new
    })
    .await;
    kafka
        .cluster
        .broker_round_trip_time(1, Duration::ZERO)
        .unwrap();

    let reader = OffsetReader::new(&kafka.brokers, "g", &kafka.topic, 3);
    let ends = reader.ends();
    wait_for("lag 0", 60, || async {
        reader.committed() == Some(ends.clone())
    })
    .await;
    member.stop().await;
    assert_exact(&pool, &expected).await;
    assert_eq!(db_offsets(&pool, "g", 3).await, ends);
    sampler.finish();
}

/// The processor's own WARN lines (JSON logs; not librdkafka's log) from line `from` on.
fn warnings(lines: &[String], from: usize) -> Vec<String> {
    let warn = lines[from.min(lines.len())..].iter();
    warn.filter(|l| l.contains("\"level\":\"WARN\"") && l.contains("\"target\":\"batch_inbox"))
        .cloned()
        .collect()
}

/// The broker stopped under a running processor for 12 s: librdkafka reports a connection error
/// for every retry (from the client's callback and from its queues), which were one WARN line
/// each (dozens in 12 s); now the outage is said once when it begins and once, at INFO, when
/// Kafka answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_is_said_in_a_few_lines_not_one_per_error() {
    let (url, pool) = fresh_db("outage_lines").await;
    let kafka = Kafka::new("outage-lines", 2);
    for i in 0..10u32 {
        kafka.send_entry((i % 2) as i32, &uuid(i), 1, 10).await;
    }
    let run = crate::common::child::Running::spawn(
        &[
            "--log-format",
            "json",
            "run",
            "--database-url",
            &url,
            "--brokers",
            &kafka.brokers,
            "--topic",
            "outage-lines",
            "--group",
            "outage-lines",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        &[("RUST_LOG", "info")],
    );
    wait_for("10 inbox rows", 60, || async {
        inbox_rows(&pool).await == 10
    })
    .await;

    let before = run.stderr_lines().len();
    kafka.cluster.broker_down(1).unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let during = warnings(&run.stderr_lines(), before);
    eprintln!(
        "{} WARN lines in the outage:\n{}",
        during.len(),
        during.join("\n")
    );
    kafka.cluster.broker_up(1).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !run.stderr_lines()[before..]
        .iter()
        .any(|l| l.contains("Kafka answers again"))
    {
        let all = run.stderr_lines()[before..].join("\n");
        assert!(std::time::Instant::now() < deadline, "not said:\n{all}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all = warnings(&run.stderr_lines(), before);
    run.stop().await;
    assert!(
        during.iter().any(|l| l.contains("Kafka unreachable")),
        "the outage is said: {during:#?}"
    );
    assert!(all.len() <= 2, "a few lines, not one per error: {all:#?}");
}

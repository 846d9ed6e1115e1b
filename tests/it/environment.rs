//! Faults of the path to the database, through the binary and Apache Kafka: a connection that
//! the network black-holes, and a prepared statement whose result type changed under it. Neither
//! is any message's fault: nothing is dead-lettered, and once the cause is gone every message is
//! applied exactly once.

use crate::common;
use crate::common::blackhole::BlackHole;
use crate::common::broker::Broker;
use crate::common::child::Running;
use crate::common::http;
use crate::common::raw_producer::RawRecord;
use crate::sql_handler::{count, produce, record, spawn_sql};
use crate::stalls::wait_until_committed;
use std::time::Duration;

use batch_inbox_tools::generate::{generate, GeneratorSettings};
use batch_inbox_tools::verify::{differences, observe};
use common::*;

/// Polls the binary's stderr until a line contains `text` (at most `limit`).
async fn wait_for_line(run: &Running, text: &str, limit: Duration) -> String {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(line) = run.stderr_lines().into_iter().find(|l| l.contains(text)) {
            return line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no line with {text:?}: {:#?}",
            run.stderr_lines()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The network stops forwarding between the binary and PostgreSQL while records arrive; the
/// proxy still acknowledges TCP, so only the client's deadline (twice the 1 s statement timeout)
/// notices. The binary drops the connection, retries until the network is back, and the
/// database then equals the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_connection_is_given_up_and_the_partition_recovers() {
    let broker = Broker::start();
    let (url, pool) = fresh_db("black_hole").await;
    let proxy = BlackHole::start(pg_host()).await;
    let db = url.rsplit('/').next().unwrap().to_owned();
    let topic = broker.topic("black-hole");
    let group = Broker::group(&topic, "g");
    batch_inbox_tools::produce::ensure_topic(&broker.addr, &topic, 2)
        .await
        .unwrap();
    let (mut first, expected) = generate(GeneratorSettings {
        messages: 4_000,
        accounts: 50,
        duplicate_ratio: 0.1,
        bad_ratio: 0.01,
        seed: 23,
        ..GeneratorSettings::default()
    });
    let second = first.split_off(first.len() / 2);
    let producer = batch_inbox_tools::produce::producer(&broker.addr, &[]).unwrap();
    batch_inbox_tools::produce::send_all(&producer, &topic, first)
        .await
        .unwrap();

    let proxied = proxy.url(&db);
    let args = [
        "run",
        "--topic",
        &topic,
        "--group",
        &group,
        "--statement-timeout",
        "1s",
        "--log-interval",
        "0",
    ];
    let env = [
        ("DATABASE_URL", proxied.as_str()),
        ("KAFKA_BROKERS", broker.addr.as_str()),
        ("RUST_LOG", "warn"),
    ];
    let run = Running::spawn(&args, &env);
    http::poll(
        Duration::from_secs(90),
        "the first records applied",
        || async { (count(&pool, "SELECT count(*) FROM inbox").await > 0).then_some(()) },
    )
    .await;

    proxy.stop_forwarding();
    batch_inbox_tools::produce::send_all(&producer, &topic, second)
        .await
        .unwrap();
    let line = wait_for_line(
        &run,
        "no answer from the database within 2000 ms",
        Duration::from_secs(60),
    )
    .await;
    assert!(line.contains("will retry"), "{line}");
    proxy.resume();

    wait_until_committed(&broker, &group, &topic, 2).await;
    let finished = run.stop().await;
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, &expected), Vec::<String>::new());
}

/// `RETURNING *` of a prepared statement changes its result type when a column is added: the
/// server refuses the cached plan (0A000) on every connection that prepared it. The stall opens
/// new sessions, which prepare the statement again, and nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_plan_whose_result_changed_is_prepared_again() {
    let broker = Broker::start();
    let (url, pool) = fresh_db("cached_plan").await;
    pool.get()
        .await
        .unwrap()
        .batch_execute("CREATE TABLE views (message_id uuid PRIMARY KEY, n int NOT NULL)")
        .await
        .unwrap();
    let sql = std::env::temp_dir().join(format!("returning-star-{}.sql", std::process::id()));
    std::fs::write(
        &sql,
        "INSERT INTO views SELECT (e->>'id')::uuid, (e->'value'->>'n')::int
         FROM jsonb_array_elements($1) e RETURNING *",
    )
    .unwrap();
    let topic = broker.topic("cached-plan");
    let records = |from: u32| -> Vec<RawRecord> {
        (from..from + 50)
            .map(|n| record(0, n, None, &format!(r#"{{"n": {n}}}"#)))
            .collect()
    };
    produce(&broker, &topic, 1, &records(1)).await;
    let run = spawn_sql(&url, &broker, &topic, "g", &sql, &["--batch-size", "10"]);
    let applied = |n: i64| {
        let pool = pool.clone();
        async move { (count(&pool, "SELECT count(*) FROM inbox").await == n).then_some(()) }
    };
    http::poll(Duration::from_secs(90), "the first 50 applied", || {
        applied(50)
    })
    .await;

    pool.get()
        .await
        .unwrap()
        .batch_execute("ALTER TABLE views ADD COLUMN note text")
        .await
        .unwrap();
    produce(&broker, &topic, 1, &records(51)).await;
    http::poll(Duration::from_secs(90), "all 100 applied", || applied(100)).await;
    let finished = run.stop().await;
    let _ = std::fs::remove_file(&sql);
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
    assert!(finished.stderr.contains("0A000"), "{}", finished.stderr);
    assert_eq!(count(&pool, "SELECT count(*) FROM dead_letters").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM views").await, 100);
    assert_eq!(
        count(&pool, "SELECT sum(n) FROM views").await,
        (1..=100).sum::<i64>()
    );
}

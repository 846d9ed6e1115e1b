//! The `batch-inbox` binary as a separate process against a real broker (Apache Kafka).

use crate::common::child::Finished;
use crate::common::group::{self, OffsetReader};
use crate::common::scenario::Scenario;
use std::time::{Duration, Instant};

use batch_inbox_tools::generate::GeneratorSettings;
use batch_inbox_tools::verify::observe;

fn ok(out: Finished) -> String {
    assert!(
        out.code == Some(0),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.code,
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// Database `db`, and a new 4-partition topic `topic` holding 20,000 generated records
/// (duplicates, bad input, overdrafts).
fn scenario(db: &str, topic: &str) -> Scenario {
    Scenario::new(db)
        .topic(topic)
        .partitions(4)
        .generated(GeneratorSettings {
            messages: 20_000,
            accounts: 300,
            duplicate_ratio: 0.15,
            bad_ratio: 0.02,
            ..GeneratorSettings::default()
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_applies_a_real_broker_topic_exactly_once() {
    let world = scenario("e2e", "e2e").build().await;
    let expected = world.expected.as_ref().unwrap();
    assert!(expected.duplicates > 0 && expected.dead_letters.len() >= 5);

    let out = ok(world.run_binary_on(&world.url, "e2e", &[]).await);
    assert!(out.contains("records 20000 "), "{out}");
    world.assert_exact().await;
    let observed = observe(&**world.pool.get().await.unwrap()).await.unwrap();

    // The per-message baseline, replaying the topic in another group, adds nothing.
    let per_message = ["--mode", "per-message"];
    let out = ok(world
        .run_binary_on(&world.url, "e2e-replay", &per_message)
        .await);
    assert!(out.contains("records 20000 new 0 "), "{out}");
    let after = observe(&**world.pool.get().await.unwrap()).await.unwrap();
    assert_eq!(after, observed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_batches_and_commits_offsets() {
    let world = scenario("e2e_sigterm", "sigterm").build().await;
    let (pool, expected) = (&world.pool, world.expected.as_ref().unwrap());
    let group = world.group("g");
    let reader = OffsetReader::new(&world.addr, &group, &world.topic, 4);
    let ends = reader.ends();
    assert_eq!(ends.iter().sum::<i64>(), 20_000);

    // librdkafka's own commits off (allowed with offsets in the database, the default): only the
    // processor's commit at shutdown can move Kafka's offsets. With them on, the periodic commit
    // and the consumer's close would commit the stored offsets too, and hide a missing one.
    let child = world.spawn("g", &["-X", "enable.auto.commit=false"]);
    // Wait for the database to hold every id (a condition, polled, with a deadline).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = group::inbox_rows(pool).await;
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
    let out = ok(child.stop().await);
    assert!(out.contains("records 20000 "), "{out}");

    // Kafka's committed offsets for the group, read without joining it: every partition's end,
    // as in the database.
    assert_eq!(group::db_offsets(pool, &group, 4).await, ends);
    assert_eq!(reader.committed(), Some(ends));
}

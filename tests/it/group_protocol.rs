//! The consumer group protocol of KIP-848 (`-X group.protocol=consumer`), which Apache Kafka 4
//! brokers serve: the broker assigns partitions and a member's arrival or departure moves only the
//! partitions that change owner. Two binaries share a group through a real broker: partitions
//! split between them, the first one leaves (SIGTERM, its offsets committed on the way out) and
//! its partitions move to the second, which reads only what came after. Exact database state,
//! and exact record counts: a commit lost at the move would make the second member read again.

use crate::common;
use crate::common::broker::Broker;
use crate::common::child::Running;
use crate::common::group::{wait_for, OffsetReader};

use batch_inbox_tools::generate::{generate, GeneratorSettings};
use batch_inbox_tools::verify::{differences, observe};
use common::*;

const PARTITIONS: i32 = 4;

fn member(url: &str, brokers: &str, topic: &str, group: &str) -> Running {
    Running::spawn(
        &[
            "run",
            "--topic",
            topic,
            "--group",
            group,
            "--log-interval",
            "0",
            "-X",
            "group.protocol=consumer",
        ],
        &[
            ("DATABASE_URL", url),
            ("KAFKA_BROKERS", brokers),
            ("RUST_LOG", "info,rdkafka=warn"),
        ],
    )
}

fn assigned(m: &Running) -> usize {
    m.stderr_lines()
        .iter()
        .filter(|l| l.contains("partition assigned"))
        .count()
}

/// The `records N` of a member's closing summary.
fn records(stdout: &str) -> u64 {
    let rest = &stdout[stdout.rfind("records ").expect("a summary line") + "records ".len()..];
    rest.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a record count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_members_under_the_consumer_protocol_and_apply_once() {
    let broker = Broker::start();
    let (url, pool) = fresh_db("group_protocol").await;
    let topic = broker.topic("kip848");
    let group = Broker::group(&topic, "g");
    batch_inbox_tools::produce::ensure_topic(&broker.addr, &topic, PARTITIONS)
        .await
        .unwrap();
    let (records_in, expected) = generate(GeneratorSettings {
        messages: 8_000,
        accounts: 200,
        duplicate_ratio: 0.1,
        // Valid records only: a second copy of a record without a valid id is a new dead letter.
        bad_ratio: 0.0,
        seed: 848,
        ..GeneratorSettings::default()
    });
    let producer = batch_inbox_tools::produce::producer(&broker.addr, &[]).unwrap();

    let a = member(&url, &broker.addr, &topic, &group);
    wait_for("member A to own every partition", 90, || async {
        assigned(&a) >= PARTITIONS as usize
    })
    .await;
    let b = member(&url, &broker.addr, &topic, &group);
    wait_for("member B to get its share", 90, || async {
        assigned(&b) >= 2
    })
    .await;

    let offsets = OffsetReader::new(&broker.addr, &group, &topic, PARTITIONS);
    batch_inbox_tools::produce::send_all(&producer, &topic, records_in.clone())
        .await
        .unwrap();
    let ends = offsets.ends();
    wait_for("the group to commit the first copy", 120, || async {
        offsets.committed().is_some_and(|c| c == ends)
    })
    .await;
    assert_eq!(
        differences(
            &observe(&**pool.get().await.unwrap()).await.unwrap(),
            &expected
        ),
        Vec::<String>::new()
    );

    // A leaves; B takes its partitions, then reads a second copy of everything: duplicates only.
    let a = a.stop().await;
    assert_eq!(a.code, Some(0), "{}", a.stderr);
    wait_for("member B to take A's partitions", 90, || async {
        assigned(&b) >= PARTITIONS as usize
    })
    .await;
    batch_inbox_tools::produce::send_all(&producer, &topic, records_in.clone())
        .await
        .unwrap();
    let ends = offsets.ends();
    wait_for("the group to commit the second copy", 120, || async {
        offsets.committed().is_some_and(|c| c == ends)
    })
    .await;
    let b = b.stop().await;
    assert_eq!(b.code, Some(0), "{}", b.stderr);

    let (by_a, by_b) = (records(&a.stdout), records(&b.stdout));
    assert!(by_a > 0 && by_b > 0, "A read {by_a}, B {by_b}: no split");
    assert_eq!(
        by_a + by_b,
        2 * records_in.len() as u64,
        "A read {by_a} and B {by_b}: a partition was read again after it moved"
    );
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, &expected), Vec::<String>::new());
}

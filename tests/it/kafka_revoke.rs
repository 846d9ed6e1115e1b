//! A topic ACL revoked while the processor runs, on the secure node (`common::secure_broker`):
//! the partition stalls visibly (`/readyz` 503 naming Kafka's refusal, the stalled gauge, one
//! WARN line), nothing is applied while Kafka refuses, and once READ is granted again it resumes
//! by itself: the final state is exactly the input's, nothing lost or applied twice.

use crate::common;
use crate::common::child::Running;
use crate::common::http;
use crate::common::secure_broker::{secure_kafka, topic, APP};
use std::time::Duration;

use batch_inbox_tools::generate::{generate, GeneratorSettings};
use batch_inbox_tools::produce::{ensure_topic, producer, send_all};
use batch_inbox_tools::verify::{differences, observe};

/// `batch_inbox_messages_consumed_total` of the process at `addr`.
async fn consumed(addr: std::net::SocketAddr) -> f64 {
    let (_, metrics) = http::get(addr, "/metrics").await;
    http::samples(&metrics)
        .get("batch_inbox_messages_consumed_total")
        .copied()
        .unwrap_or(0.0)
}

/// The stalled gauge of `topic`/0 at `addr`.
async fn stalled(addr: std::net::SocketAddr, topic: &str) -> f64 {
    let (_, metrics) = http::get(addr, "/metrics").await;
    let series = format!("batch_inbox_stalled{{topic=\"{topic}\",partition=\"0\"}}");
    http::samples(&metrics).get(&series).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_acl_revoked_while_running_stalls_the_partition_until_granted_again() {
    let kafka = secure_kafka();
    let (url, pool) = common::fresh_db("kafka_acl_revoke").await;
    let topic = topic("revoke");
    let group = format!("{topic}.g");
    ensure_topic(&kafka.plaintext, &topic, 1).await.unwrap();
    let (mut first, expected) = generate(GeneratorSettings {
        messages: 1_000,
        accounts: 20,
        duplicate_ratio: 0.1,
        bad_ratio: 0.02,
        ..GeneratorSettings::default()
    });
    let second = first.split_off(first.len() / 2);
    let (n_first, n_all) = (first.len() as f64, (first.len() + second.len()) as f64);
    let app = format!("User:{}", APP.0);
    let read = [
        "--allow-principal",
        &app,
        "--operation",
        "Read",
        "--topic",
        &topic,
    ];
    kafka.acl(&[&["--add"][..], &read, &["--group", &group]].concat());
    let produce = producer(&kafka.plaintext, &[]).unwrap();
    send_all(&produce, &topic, first).await.unwrap();

    let mut args = vec![
        "run",
        "--brokers",
        &kafka.sasl_ssl,
        "--topic",
        &topic,
        "--group",
        &group,
        "--metrics-addr",
        "127.0.0.1:0",
        "--log-interval",
        "0",
    ];
    let props = kafka.sasl_properties(APP.0, APP.1);
    for p in &props {
        args.extend(["-X", p.as_str()]);
    }
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("RUST_LOG", "info,rdkafka=warn"),
    ];
    let mut run = Running::spawn(&args, &env);
    let addr = run.metrics_addr().await;
    http::poll(
        Duration::from_secs(90),
        "the first half applied",
        || async { (consumed(addr).await == n_first).then_some(()) },
    )
    .await;

    kafka.acl(&[&["--remove"][..], &read].concat());
    let body = http::poll(
        Duration::from_secs(60),
        "/readyz to say stalled",
        || async {
            let (status, body) = http::get(addr, "/readyz").await;
            (status == 503 && body.contains("stalled")).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains(&format!("{topic}/0 (Kafka: topic authorization failed")),
        "{body}"
    );
    assert_eq!(stalled(addr, &topic).await, 1.0);
    // Records that arrive while Kafka refuses the fetches wait in the topic.
    send_all(&produce, &topic, second).await.unwrap();
    assert_eq!(consumed(addr).await, n_first);

    kafka.acl(&[&["--add"][..], &read].concat());
    http::poll(
        Duration::from_secs(90),
        "the second half applied",
        || async { (consumed(addr).await == n_all).then_some(()) },
    )
    .await;
    let (status, body) = http::get(addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stalled(addr, &topic).await, 0.0);
    let finished = run.stop().await;
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
    assert!(
        finished
            .stderr
            .contains("partition stalled: Kafka refuses its fetches (topic authorization failed)"),
        "{}",
        finished.stderr
    );
    assert!(!finished.stderr.contains(APP.1), "{}", finished.stderr);
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, &expected), Vec::<String>::new());
}

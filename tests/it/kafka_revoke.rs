//! ACLs revoked while the processor runs, on the secure node (`common::secure_broker`). The
//! topic's READ: the partition stalls visibly (`/readyz` 503 naming Kafka's refusal, the stalled
//! gauge, one WARN line), nothing is applied while Kafka refuses. The group's READ: the member
//! stalls visibly (the gauge's `partition="member"` series) while records are still applied with
//! their offsets in the database. Once granted again each resumes by itself: the final state is
//! exactly the input's, nothing lost or applied twice, and Kafka's committed offset reaches the
//! end.

use crate::common;
use crate::common::child::Running;
use crate::common::group::OffsetReader;
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

/// The stalled gauge of `topic`'s `partition` series (`0`, or `member`) at `addr`, by Kafka's
/// refusal (`reason="kafka"`).
async fn stalled(addr: std::net::SocketAddr, topic: &str, partition: &str) -> f64 {
    let (_, metrics) = http::get(addr, "/metrics").await;
    let series = format!(
        "batch_inbox_stalled{{topic=\"{topic}\",partition=\"{partition}\",reason=\"kafka\"}}"
    );
    http::samples(&metrics).get(&series).copied().unwrap_or(0.0)
}

/// A processor as `app` on a new one-partition topic, granted READ on it and on its group,
/// that applied the first half of 1,000 generated records; the second half is left to send.
struct Case {
    topic: String,
    group: String,
    app: String,
    pool: deadpool_postgres::Pool,
    expected: batch_inbox_tools::generate::Expected,
    second: Vec<batch_inbox_tools::generate::Record>,
    total: f64,
    producer: rdkafka::producer::FutureProducer,
    run: Running,
    addr: std::net::SocketAddr,
}

impl Case {
    async fn start(name: &str) -> Case {
        let kafka = secure_kafka();
        let (url, pool) = common::fresh_db(&format!("kafka_revoke_{name}")).await;
        let topic = topic(&format!("revoke-{name}"));
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
        let (n_first, total) = (first.len() as f64, (first.len() + second.len()) as f64);
        let app = format!("User:{}", APP.0);
        kafka.acl(&[
            "--add",
            "--allow-principal",
            &app,
            "--operation",
            "Read",
            "--topic",
            &topic,
            "--group",
            &group,
        ]);
        let producer = producer(&kafka.plaintext, &[]).unwrap();
        send_all(&producer, &topic, first).await.unwrap();
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
        Case {
            topic,
            group,
            app,
            pool,
            expected,
            second,
            total,
            producer,
            run,
            addr,
        }
    }

    /// `--add` or `--remove` READ on `resource` (`--topic` or `--group`) for `app`.
    fn read_acl(&self, action: &str, resource: &str) {
        let name = match resource {
            "--topic" => &self.topic,
            _ => &self.group,
        };
        let app = self.app.as_str();
        secure_kafka().acl(&[
            action,
            "--allow-principal",
            app,
            "--operation",
            "Read",
            resource,
            name,
        ]);
    }

    async fn send_second_half(&mut self) {
        let second = std::mem::take(&mut self.second);
        send_all(&self.producer, &self.topic, second).await.unwrap();
    }

    /// Polls `/readyz` until it answers 503 with `needle`.
    async fn stalled_with(&self, needle: &str) {
        let addr = self.addr;
        let body = http::poll(
            Duration::from_secs(60),
            "/readyz to say stalled",
            || async {
                let (status, body) = http::get(addr, "/readyz").await;
                (status == 503 && body.contains("stalled")).then_some(body)
            },
        )
        .await;
        assert!(body.contains(needle), "{body}");
    }

    /// Everything applied, ready, the gauge back to 0; stopped: the exact state, `warned` logged.
    async fn finish(self, series: &str, warned: &str) {
        let (addr, total) = (self.addr, self.total);
        http::poll(Duration::from_secs(90), "every record applied", || async {
            (consumed(addr).await == total).then_some(())
        })
        .await;
        http::poll(Duration::from_secs(60), "/readyz to say ready", || async {
            let (status, _) = http::get(addr, "/readyz").await;
            (status == 200).then_some(())
        })
        .await;
        assert_eq!(stalled(addr, &self.topic, series).await, 0.0);
        let finished = self.run.stop().await;
        assert_eq!(finished.code, Some(0), "{}", finished.stderr);
        assert!(finished.stderr.contains(warned), "{}", finished.stderr);
        assert!(!finished.stderr.contains(APP.1), "{}", finished.stderr);
        let observed = observe(&**self.pool.get().await.unwrap()).await.unwrap();
        assert_eq!(differences(&observed, &self.expected), Vec::<String>::new());
        let kafka = secure_kafka();
        let reader = OffsetReader::new(&kafka.plaintext, &self.group, &self.topic, 1);
        assert_eq!(
            reader.committed(),
            Some(reader.ends()),
            "Kafka's committed offset"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_acl_revoked_while_running_stalls_the_partition_until_granted_again() {
    let mut case = Case::start("topic").await;
    case.read_acl("--remove", "--topic");
    let topic = case.topic.clone();
    case.stalled_with(&format!("{topic}/0 (Kafka: topic authorization failed"))
        .await;
    assert_eq!(stalled(case.addr, &topic, "0").await, 1.0);
    // Records that arrive while Kafka refuses the fetches wait in the topic.
    case.send_second_half().await;
    assert_eq!(consumed(case.addr).await, case.total - 500.0);
    case.read_acl("--add", "--topic");
    case.finish(
        "0",
        "partition stalled: Kafka refuses its fetches (topic authorization failed)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_acl_revoked_while_running_stalls_the_member_until_granted_again() {
    let mut case = Case::start("group").await;
    case.read_acl("--remove", "--group");
    let topic = case.topic.clone();
    case.send_second_half().await;
    case.stalled_with(&format!("the group member stalled, not the messages' fault: {topic} member (Kafka: group authorization failed"))
        .await;
    assert_eq!(stalled(case.addr, &topic, "member").await, 1.0);
    case.read_acl("--add", "--group");
    case.finish(
        "member",
        "group member stalled: Kafka refuses the group's offset commits (group authorization failed)",
    )
    .await;
}

//! The binary against an Apache Kafka node with TLS, SASL/SCRAM and an authorizer (the secure
//! node of `common::secure_broker`): it drains a topic exactly over `SSL` and over `SASL_SSL`
//! (`-X` flags and the config file's `[librdkafka]` table), with only the ACLs that
//! docs/OPERATIONS.md lists; and each refusal at start (an unknown certificate authority, a wrong
//! password, a missing topic or group ACL, no broker at all) ends it with exit 1 and one line
//! naming the cause before anything is applied.

use crate::common::child::Finished;
use crate::common::scenario::Scenario;
use crate::common::secure_broker::{secure_kafka, SecureKafka, ADMIN, APP};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use batch_inbox_tools::generate::GeneratorSettings;

/// Prefixes of the topics and groups `app` is granted (prefixed ACLs, created once): `acl-ok-`
/// topics READ and DESCRIBE_CONFIGS and groups READ, the whole list of the docs; `acl-nogroup-`
/// topics READ with no group; `acl-notopic-` groups READ with no topic; `acl-describe-` groups
/// READ and topics DESCRIBE only.
fn grant_app() -> &'static SecureKafka {
    static GRANTED: OnceLock<()> = OnceLock::new();
    let kafka = secure_kafka();
    GRANTED.get_or_init(|| {
        let app = format!("User:{}", APP.0);
        kafka.acl(&[
            "--add",
            "--allow-principal",
            &app,
            "--operation",
            "Read",
            "--topic",
            "acl-ok-",
            "--topic",
            "acl-nogroup-",
            "--group",
            "acl-ok-",
            "--group",
            "acl-notopic-",
            "--group",
            "acl-describe-",
            "--resource-pattern-type",
            "prefixed",
        ]);
        kafka.acl(&[
            "--add",
            "--allow-principal",
            &app,
            "--operation",
            "Describe",
            "--topic",
            "acl-describe-",
            "--resource-pattern-type",
            "prefixed",
        ]);
        kafka.acl(&[
            "--add",
            "--allow-principal",
            &app,
            "--operation",
            "DescribeConfigs",
            "--topic",
            "acl-ok-",
            "--resource-pattern-type",
            "prefixed",
        ]);
    });
    kafka
}

/// A scenario on the secure node: database `db`, a new topic `topic` of 2 partitions holding
/// 2,000 generated ledger records (duplicates, bad input), produced over PLAINTEXT; the processor
/// connects to `listener`.
fn on_secure_node(kafka: &SecureKafka, db: &str, topic: &str, listener: &str) -> Scenario {
    Scenario::new(db)
        .topic(topic)
        .on(&kafka.plaintext)
        .connect(listener)
        .partitions(2)
        .generated(GeneratorSettings {
            messages: 2_000,
            accounts: 50,
            duplicate_ratio: 0.1,
            bad_ratio: 0.02,
            ..GeneratorSettings::default()
        })
}

/// `-X` flags of librdkafka `properties`.
fn x(properties: &[String]) -> Vec<String> {
    properties
        .iter()
        .flat_map(|p| ["-X".to_owned(), p.clone()])
        .collect()
}

#[track_caller]
fn assert_drained(out: &Finished) {
    assert_eq!(
        out.code,
        Some(0),
        "stdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    assert!(out.stdout.contains("records 2000 "), "{}", out.stdout);
}

/// A refusal at start: exit 1, one `error:` line containing `needle`, nothing applied.
#[track_caller]
fn assert_refused(out: &Finished, needle: &str) {
    assert_eq!(
        out.code,
        Some(1),
        "stdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {}", out.stderr);
    assert!(errors[0].contains(needle), "{}", errors[0]);
    for secret in [ADMIN.1, APP.1] {
        assert!(
            !out.stderr.contains(secret) && !out.stdout.contains(secret),
            "{}",
            out.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_a_topic_exactly_over_ssl() {
    let kafka = secure_kafka();
    let (world, out) = on_secure_node(kafka, "kafka_ssl", "ssl", &kafka.ssl)
        .args(&x(&SecureKafka::ssl_properties(&kafka.ca())))
        .run_binary()
        .await;
    assert_drained(&out);
    world.assert_exact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_a_topic_exactly_over_sasl_ssl_with_only_the_documented_acls() {
    let kafka = grant_app();
    // --dedup-window reads the topic's retention.ms (DESCRIBE_CONFIGS) at start.
    let (world, out) = on_secure_node(kafka, "kafka_sasl", "acl-ok-sasl", &kafka.sasl_ssl)
        .args(&x(&kafka.sasl_properties(APP.0, APP.1)))
        .args(&["--dedup-window", "30d"])
        .run_binary()
        .await;
    assert_drained(&out);
    // The node keeps records forever (retention.ms -1): read, so the guard warns.
    assert!(
        out.stderr.contains("is longer than the inbox retention"),
        "retention.ms was read: {}",
        out.stderr
    );
    world.assert_exact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_files_librdkafka_table_carries_the_sasl_ssl_settings() {
    let kafka = secure_kafka();
    let world = on_secure_node(kafka, "kafka_sasl_file", "sasl-file", &kafka.sasl_ssl)
        .brokers_from_args()
        .build()
        .await;
    let file = kafka.dir.join(format!("{}.toml", world.topic));
    let toml = format!(
        "brokers = {:?}\n[librdkafka]\n\"security.protocol\" = \"SASL_SSL\"\n\
         \"ssl.ca.location\" = {:?}\n\"sasl.mechanism\" = \"SCRAM-SHA-512\"\n\
         \"sasl.username\" = {:?}\n\"sasl.password\" = {:?}\n",
        kafka.sasl_ssl,
        kafka.ca().display().to_string(),
        ADMIN.0,
        ADMIN.1
    );
    std::fs::write(&file, toml).unwrap();
    let config = ["--config", file.to_str().unwrap()];
    let out = world.run_binary_on(&world.url, "g", &config).await;
    assert_drained(&out);
    world.assert_exact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_from_another_ca_is_refused_at_start() {
    let kafka = secure_kafka();
    let (world, out) = on_secure_node(kafka, "kafka_other_ca", "other-ca", &kafka.ssl)
        .args(&x(&SecureKafka::ssl_properties(&kafka.other_ca())))
        .args(&["--startup-timeout", "30s"])
        .run_binary()
        .await;
    assert_refused(&out, "TLS handshake failed");
    assert!(
        out.stderr.contains("certificate verify failed"),
        "{}",
        out.stderr
    );
    assert_eq!(world.applied().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_at_start_with_one_line() {
    let kafka = secure_kafka();
    let wrong = "not-the-Pw-5e1b";
    let world = on_secure_node(
        kafka,
        "kafka_wrong_password",
        "wrong-password",
        &kafka.sasl_ssl,
    )
    .args(&x(&kafka.sasl_properties(APP.0, wrong)))
    .args(&["--startup-timeout", "60s"])
    .build()
    .await;
    let started = Instant::now();
    let out = world.run_binary().await;
    assert_refused(&out, "SASL authentication failed");
    assert!(!out.stderr.contains(wrong), "{}", out.stderr);
    // Refused credentials end the probe at once, not at the end of --startup-timeout.
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(world.applied().await, 0);
}

/// The application user's run over SASL_SSL on topic `name` (made by the admin, whose ACLs
/// [`grant_app`] set): refused at start with the line `refusal(topic)`, nothing applied.
async fn assert_refused_by_acls(db: &str, name: &str, refusal: impl Fn(&str) -> String) {
    let kafka = grant_app();
    let (world, out) = on_secure_node(kafka, db, name, &kafka.sasl_ssl)
        .args(&x(&kafka.sasl_properties(APP.0, APP.1)))
        .run_binary()
        .await;
    assert_refused(&out, &refusal(&world.topic));
    assert_eq!(world.applied().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_acl_fails_at_start() {
    assert_refused_by_acls("kafka_acl_topic", "acl-notopic-t", |topic| {
        format!("Kafka topic `{topic}`: authorization failed")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_acl_of_describe_without_read_fails_at_start() {
    assert_refused_by_acls("kafka_acl_describe", "acl-describe-t", |topic| {
        format!("Kafka topic `{topic}`: authorization failed")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_group_acl_fails_at_start() {
    assert_refused_by_acls("kafka_acl_group", "acl-nogroup-t", |topic| {
        format!("Kafka consumer group `{topic}.g`: authorization failed")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_broker_at_start_fails_after_the_startup_timeout() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let brokers = format!("127.0.0.1:{port}");
    let world = Scenario::new("kafka_unreachable")
        .on(&brokers)
        .topic_named("none")
        .args(&["--startup-timeout", "2s"])
        .build()
        .await;
    let started = Instant::now();
    let out = world.run_binary().await;
    let waited = started.elapsed();
    assert_refused(
        &out,
        &format!("Kafka at {brokers}: no broker answered within 2 s"),
    );
    assert!(out.stderr.contains("Connection refused"), "{}", out.stderr);
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(30),
        "{waited:?}"
    );
    assert_eq!(world.applied().await, 0);
}

//! The binary against an Apache Kafka node with TLS, SASL/SCRAM and an authorizer (the secure
//! node of `common::secure_broker`): it drains a topic exactly over `SSL` and over `SASL_SSL`
//! (`-X` flags and the config file's `[librdkafka]` table), with only the ACLs that
//! docs/OPERATIONS.md lists; and each refusal at start (an unknown certificate authority, a wrong
//! password, a missing topic or group ACL, no broker at all) ends it with exit 1 and one line
//! naming the cause before anything is applied.

use crate::common;
use crate::common::child::{Finished, Running};
use crate::common::secure_broker::{secure_kafka, topic, SecureKafka, ADMIN, APP};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use batch_inbox_tools::generate::{generate, Expected, GeneratorSettings};
use batch_inbox_tools::verify::{differences, observe};
use deadpool_postgres::Pool;

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

/// A new topic of 2 partitions on the secure node holding 2,000 generated ledger records
/// (duplicates, bad input), produced over PLAINTEXT.
async fn produce(kafka: &SecureKafka, topic: &str) -> Expected {
    batch_inbox_tools::produce::ensure_topic(&kafka.plaintext, topic, 2)
        .await
        .unwrap();
    let (records, expected) = generate(GeneratorSettings {
        messages: 2_000,
        accounts: 50,
        duplicate_ratio: 0.1,
        bad_ratio: 0.02,
        ..GeneratorSettings::default()
    });
    let producer = batch_inbox_tools::produce::producer(&kafka.plaintext, &[]).unwrap();
    batch_inbox_tools::produce::send_all(&producer, topic, records)
        .await
        .unwrap();
    expected
}

/// `run --exit-on-eof` of `topic` at `brokers` with `-X` `properties` and `extra` flags, to its
/// end (at most 120 s).
async fn run(
    url: &str,
    brokers: &str,
    topic: &str,
    properties: &[String],
    extra: &[&str],
) -> Finished {
    let group = format!("{topic}.g");
    let mut args = vec![
        "run",
        "--brokers",
        brokers,
        "--topic",
        topic,
        "--group",
        &group,
        "--exit-on-eof",
    ];
    for p in properties {
        args.extend(["-X", p.as_str()]);
    }
    args.extend(extra);
    Running::spawn(&args, &[("DATABASE_URL", url), ("RUST_LOG", "warn")])
        .wait(Duration::from_secs(120))
        .await
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

/// The database state equals the model's: every balance, inbox row and dead letter.
async fn assert_exact(pool: &Pool, expected: &Expected) {
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, expected), Vec::<String>::new());
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

async fn applied(pool: &Pool) -> i64 {
    let c = pool.get().await.unwrap();
    c.query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_a_topic_exactly_over_ssl() {
    let kafka = secure_kafka();
    let (url, pool) = common::fresh_db("kafka_ssl").await;
    let topic = topic("ssl");
    let expected = produce(kafka, &topic).await;
    let out = run(
        &url,
        &kafka.ssl,
        &topic,
        &SecureKafka::ssl_properties(&kafka.ca()),
        &[],
    )
    .await;
    assert_drained(&out);
    assert_exact(&pool, &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_a_topic_exactly_over_sasl_ssl_with_only_the_documented_acls() {
    let kafka = grant_app();
    let (url, pool) = common::fresh_db("kafka_sasl").await;
    let topic = topic("acl-ok-sasl");
    let expected = produce(kafka, &topic).await;
    // --dedup-window reads the topic's retention.ms (DESCRIBE_CONFIGS) at start.
    let props = kafka.sasl_properties(APP.0, APP.1);
    let out = run(
        &url,
        &kafka.sasl_ssl,
        &topic,
        &props,
        &["--dedup-window", "30d"],
    )
    .await;
    assert_drained(&out);
    // The node keeps records forever (retention.ms -1): read, so the guard warns.
    assert!(
        out.stderr.contains("is longer than the inbox retention"),
        "retention.ms was read: {}",
        out.stderr
    );
    assert_exact(&pool, &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_files_librdkafka_table_carries_the_sasl_ssl_settings() {
    let kafka = secure_kafka();
    let (url, pool) = common::fresh_db("kafka_sasl_file").await;
    let topic = topic("sasl-file");
    let expected = produce(kafka, &topic).await;
    let file = kafka.dir.join(format!("{topic}.toml"));
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
    let group = format!("{topic}.g");
    let out = Running::spawn(
        &[
            "run",
            "--config",
            file.to_str().unwrap(),
            "--topic",
            &topic,
            "--group",
            &group,
            "--exit-on-eof",
        ],
        &[("DATABASE_URL", &url), ("RUST_LOG", "warn")],
    )
    .wait(Duration::from_secs(120))
    .await;
    assert_drained(&out);
    assert_exact(&pool, &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_from_another_ca_is_refused_at_start() {
    let kafka = secure_kafka();
    let (url, pool) = common::fresh_db("kafka_other_ca").await;
    let topic = topic("other-ca");
    produce(kafka, &topic).await;
    let props = SecureKafka::ssl_properties(&kafka.other_ca());
    let out = run(
        &url,
        &kafka.ssl,
        &topic,
        &props,
        &["--startup-timeout", "30s"],
    )
    .await;
    assert_refused(&out, "TLS handshake failed");
    assert!(
        out.stderr.contains("certificate verify failed"),
        "{}",
        out.stderr
    );
    assert_eq!(applied(&pool).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_at_start_with_one_line() {
    let kafka = secure_kafka();
    let (url, pool) = common::fresh_db("kafka_wrong_password").await;
    let topic = topic("wrong-password");
    produce(kafka, &topic).await;
    let wrong = "not-the-Pw-5e1b";
    let props = kafka.sasl_properties(APP.0, wrong);
    let started = Instant::now();
    let out = run(
        &url,
        &kafka.sasl_ssl,
        &topic,
        &props,
        &["--startup-timeout", "60s"],
    )
    .await;
    assert_refused(&out, "SASL authentication failed");
    assert!(!out.stderr.contains(wrong), "{}", out.stderr);
    // Refused credentials end the probe at once, not at the end of --startup-timeout.
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(applied(&pool).await, 0);
}

/// The application user's run over SASL_SSL on topic `name` (made by the admin, whose ACLs
/// [`grant_app`] set): refused at start with the line `refusal(topic)`, nothing applied.
async fn assert_refused_by_acls(db: &str, name: &str, refusal: impl Fn(&str) -> String) {
    let kafka = grant_app();
    let (url, pool) = common::fresh_db(db).await;
    let topic = topic(name);
    produce(kafka, &topic).await;
    let props = kafka.sasl_properties(APP.0, APP.1);
    let out = run(&url, &kafka.sasl_ssl, &topic, &props, &[]).await;
    assert_refused(&out, &refusal(&topic));
    assert_eq!(applied(&pool).await, 0);
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
    let (url, pool) = common::fresh_db("kafka_unreachable").await;
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let brokers = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let out = run(&url, &brokers, "none", &[], &["--startup-timeout", "2s"]).await;
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
    assert_eq!(applied(&pool).await, 0);
}

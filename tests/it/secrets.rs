//! No secret is ever shown: a recognisable password, given as the database URL's password (in
//! every form tokio-postgres accepts) and as the value of librdkafka properties, appears in no
//! output of the binary (help, `--print-config`, errors, logs at debug level of a run through a
//! database outage), in no `/readyz` body, and in no `{:?}` of the configuration types.

use crate::common;
use crate::common::child;
use crate::common::http;
use crate::common::postgres;
use std::process::Command;
use std::time::Duration;

use batch_inbox::internals::secret::LIBRDKAFKA_SENSITIVE;
use common::{db_name, fresh_db, uuid, Kafka};

const PW: &str = "Sup3rS3cretPw";

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the binary to its end with `args` and `env` (and none of the caller's settings).
fn binary(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_batch-inbox"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("BATCH_INBOX_") || ["DATABASE_URL", "KAFKA_BROKERS"].contains(&k.as_str())
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("RUST_LOG", "debug").envs(env.iter().copied());
    let out = cmd.output().expect("the binary runs");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[track_caller]
fn assert_hidden(what: &str, out: &Out) {
    for (stream, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        assert!(
            !text.contains(PW),
            "{what}: the password is on {stream}:\n{text}"
        );
    }
}

/// Every form of a database URL with the password.
fn url_forms(host: &str, db: &str) -> Vec<String> {
    vec![
        format!("postgres://postgres:{PW}@{host}/{db}"),
        format!("postgresql://postgres@{host}/{db}?password={PW}"),
        format!("postgres://postgres@{host}/{db}?sslmode=disable&password={PW}"),
        format!(
            "host={} user=postgres password={PW} dbname={db}",
            host_only(host)
        ),
        format!(
            "host={} port={} user=postgres password='{PW} with spaces' dbname={db}",
            host_only(host),
            port_only(host)
        ),
    ]
}

fn host_only(host: &str) -> &str {
    host.split(':').next().unwrap_or(host)
}

fn port_only(host: &str) -> &str {
    host.split(':').nth(1).unwrap_or("5432")
}

#[test]
fn help_does_not_show_the_database_url_of_the_environment() {
    let url = format!("postgres://app:{PW}@db.example/ledger");
    for sub in ["run", "migrate", "cleanup"] {
        let out = binary(&[sub, "--help"], &[("DATABASE_URL", &url)]);
        assert_eq!(out.code, 0, "{sub}: {}", out.stderr);
        assert!(
            out.stdout.contains("[env: DATABASE_URL]"),
            "{sub}: {}",
            out.stdout
        );
        assert_hidden(&format!("{sub} --help"), &out);
    }
}

#[test]
fn print_config_hides_every_password_form_from_flags_env_and_file() {
    let mut properties: Vec<String> = LIBRDKAFKA_SENSITIVE
        .iter()
        .map(|k| match *k {
            "sasl.oauthbearer.config" => format!("{k}=principal=app secret={PW}"),
            _ => format!("{k}={PW}"),
        })
        .collect();
    properties.push(format!("my.custom.token={PW}"));
    for url in url_forms("db.example:5433", "ledger") {
        let mut args = vec!["run", "--print-config", "--database-url", &url];
        for p in &properties {
            args.extend(["-X", p.as_str()]);
        }
        let flags = binary(&args, &[]);
        let env = binary(&["run", "--print-config"], &[("DATABASE_URL", &url)]);
        let file = std::env::temp_dir().join(format!("secrets-{}.toml", std::process::id()));
        let mut toml = format!("database-url = {url:?}\n[librdkafka]\n");
        for p in &properties {
            let (k, v) = p.split_once('=').unwrap();
            toml.push_str(&format!("{k:?} = {v:?}\n"));
        }
        std::fs::write(&file, toml).unwrap();
        let from_file = binary(
            &["run", "--print-config", "--config", file.to_str().unwrap()],
            &[],
        );
        for (source, out) in [("flag", &flags), ("env", &env), ("file", &from_file)] {
            assert_eq!(out.code, 0, "{source}: {}", out.stderr);
            let line = out
                .stdout
                .lines()
                .find(|l| l.starts_with("database-url = "))
                .unwrap_or_else(|| panic!("no database-url line: {}", out.stdout));
            assert!(
                line.contains("***") && line.ends_with(&format!("# {source}")),
                "{line}"
            );
            assert_hidden(&format!("{url} from {source}"), out);
        }
        let shown = flags
            .stdout
            .lines()
            .find(|l| l.starts_with("X = "))
            .unwrap();
        assert_eq!(
            shown.matches("=***").count(),
            properties.len(),
            "every sensitive property is masked: {shown}"
        );
    }
}

#[test]
fn an_unreachable_database_is_reported_without_its_password() {
    for url in url_forms("127.0.0.1:1", "none") {
        for args in [&["run", "--startup-timeout", "1s"][..], &["migrate"]] {
            let sub = args[0];
            let mut args = args.to_vec();
            args.extend(["--database-url", &url]);
            let out = binary(&args, &[]);
            assert_eq!(out.code, 1, "{sub} {url}: {}", out.stderr);
            assert!(
                out.stderr
                    .lines()
                    .any(|l| l.starts_with("error: cannot connect to the database")),
                "{}",
                out.stderr
            );
            assert_hidden(&format!("{sub} {url}"), &out);
        }
    }
    let bad = format!("postgres://app:{PW}@db:notaport/x");
    let out = binary(&["migrate", "--database-url", &bad], &[]);
    assert!(
        out.stderr.contains("error: invalid database URL"),
        "{}",
        out.stderr
    );
    assert_hidden("an invalid URL", &out);
    // The driver's parser quotes the character where it expected `=`: one of the password's here.
    let out = binary(
        &["migrate", "--database-url", "password=Sup3r S3cret Pw"],
        &[],
    );
    assert!(
        out.stderr.starts_with("error: invalid database URL") && !out.stderr.contains("`P`"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_kafka_property_is_named_without_its_value() {
    let (url, _pool) = fresh_db("secrets_kafka_errors").await;
    let url = url.replace(
        "postgres://postgres@",
        &format!("postgres://postgres:{PW}@"),
    );
    let unknown = format!("sasl.pasword={PW}");
    let invalid = format!("fetch.min.bytes={PW}");
    let pem = format!("ssl.key.pem={PW}");
    for (props, needle) in [
        (vec![unknown.as_str()], "`sasl.pasword`: no such property"),
        (vec![invalid.as_str()], "`fetch.min.bytes`: invalid value"),
        (
            vec!["security.protocol=ssl", pem.as_str()],
            "cannot create the Kafka client",
        ),
    ] {
        let mut args = vec!["run", "--database-url", &url, "--brokers", "127.0.0.1:1"];
        for p in &props {
            args.extend(["-X", p]);
        }
        let out = binary(&args, &[]);
        assert_eq!(out.code, 1, "{props:?}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{props:?}: {}", out.stderr);
        assert_hidden(&format!("{props:?}"), &out);
    }
    let colon = format!("sasl.password:{PW}");
    let out = binary(&["run", "-X", &colon], &[]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_hidden("-X without =", &out);
    let out = binary(&["run", "-X", "sasl.password", PW], &[]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.starts_with("error: unexpected argument"),
        "{}",
        out.stderr
    );
    assert_hidden("-X with the value as a separate argument", &out);
    let out = binary(&["run", "--no-such-flag"], &[]);
    assert!(
        out.stderr.contains("'--no-such-flag'"),
        "flags are still named: {}",
        out.stderr
    );

    // The producer of `produce` and the admin client of the retention check.
    let props = vec![("sasl.pasword".to_owned(), PW.to_owned())];
    let Err(err) = batch_inbox_tools::produce::producer("127.0.0.1:1", &props) else {
        panic!("a producer with an unknown property")
    };
    assert!(!format!("{err} {err:?}").contains(PW), "{err}");
    let mut kafka = batch_inbox::KafkaSettings::new("127.0.0.1:1", "t", "g");
    kafka.overrides = vec![
        ("security.protocol".to_owned(), "ssl".to_owned()),
        ("ssl.key.pem".to_owned(), PW.to_owned()),
    ];
    let week = Duration::from_secs(7 * 86_400);
    let outcome = batch_inbox::retention::topic::check(&kafka, week).await;
    assert!(
        matches!(&outcome, batch_inbox::retention::topic::TopicRetention::Unknown(why)
            if why.starts_with("admin client: cannot create the Kafka client")),
        "{outcome:?}"
    );
    assert!(!format!("{outcome:?}").contains(PW));
}

/// The Kafka side's refusals at start, against the secure node (`common::secure_broker`): a
/// wrong SASL password, a TLS handshake with an unknown certificate authority (with the password
/// set), and a refused ACL with the right password; none shows a password, at debug level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_refusals_at_start_show_no_password() {
    use common::secure_broker::{secure_kafka, APP};
    let kafka = secure_kafka();
    let (url, _pool) = fresh_db("secrets_kafka_refusals").await;
    let topic = common::secure_broker::topic("secrets");
    batch_inbox_tools::produce::ensure_topic(&kafka.plaintext, &topic, 1)
        .await
        .unwrap();
    let sasl = |password: &str, ca: &std::path::Path| {
        vec![
            "security.protocol=SASL_SSL".to_owned(),
            format!("ssl.ca.location={}", ca.display()),
            "sasl.mechanism=SCRAM-SHA-512".to_owned(),
            format!("sasl.username={}", APP.0),
            format!("sasl.password={password}"),
        ]
    };
    for (props, needle, secret) in [
        (sasl(PW, &kafka.ca()), "SASL authentication failed", PW),
        (sasl(PW, &kafka.other_ca()), "TLS handshake failed", PW),
        (sasl(APP.1, &kafka.ca()), "authorization failed", APP.1),
    ] {
        let mut args = vec![
            "run",
            "--database-url",
            &url,
            "--brokers",
            &kafka.sasl_ssl,
            "--topic",
            &topic,
            "--startup-timeout",
            "30s",
        ];
        for p in &props {
            args.extend(["-X", p.as_str()]);
        }
        let out = binary(&args, &[]);
        assert_eq!(out.code, 1, "{needle}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{needle}: {}", out.stderr);
        for (stream, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            assert!(
                !text.contains(secret),
                "{needle}: the password is on {stream}:\n{text}"
            );
        }
    }
}

/// Polls /readyz until it answers `status`; returns the body.
async fn readyz_becomes(addr: std::net::SocketAddr, status: u16) -> String {
    let what = format!("/readyz to answer {status}");
    http::poll(Duration::from_secs(60), &what, || async {
        let (s, body) = http::get(addr, "/readyz").await;
        (s == status).then_some(body)
    })
    .await
}

async fn inbox_rows(url: &str) -> Option<i64> {
    let pool = batch_inbox::db::connect(url, 1).await.ok()?;
    let client = pool.get().await.ok()?;
    let row = client.query_one("SELECT count(*) FROM inbox", &[]).await;
    row.ok().map(|r| r.get(0))
}

/// A run with a password in its database URL and in a SASL property, logging at debug level,
/// through a database outage: the password is in no line, and `/readyz` says only which
/// dependency is missing while the log has the driver's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_through_an_outage_logs_no_secret_and_readyz_tells_only_the_reason() {
    let pg = postgres::PrivatePostgres::start();
    let name = db_name("secrets_run");
    let admin = batch_inbox::db::connect(&pg.url("postgres"), 1)
        .await
        .unwrap();
    let c = admin.get().await.unwrap();
    c.batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    drop(c);
    // Trust authentication accepts any password: the run really connects with this one.
    let url = format!("postgres://postgres:{PW}@127.0.0.1:{}/{name}", pg.port);
    let pool = batch_inbox::db::connect(&url, 1).await.unwrap();
    batch_inbox::db::migrate(&pool).await.unwrap();
    batch_inbox::ledger::migrate(&pool).await.unwrap();
    drop(pool);
    let kafka = Kafka::new("secrets-run", 2);
    for i in 0..10u32 {
        kafka.send_entry((i % 2) as i32, &uuid(i), 1, 10).await;
    }
    let sasl = format!("sasl.password={PW}");
    let mut run = child::Running::spawn(
        &[
            "--log-format",
            "json",
            "run",
            "--database-url",
            &url,
            "--brokers",
            &kafka.brokers,
            "--topic",
            "secrets-run",
            "--group",
            "secrets-run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--log-interval",
            "200ms",
            "-X",
            &sasl,
            "-X",
            "session.timeout.ms=6000",
        ],
        &[("RUST_LOG", "debug")],
    );
    let addr = run.metrics_addr().await;
    let body = readyz_becomes(addr, 200).await;
    assert_eq!(body, "ready: database reachable, 2 partition(s) assigned\n");
    // The first records are committed before the outage: a COMMIT cut off by the shutdown would
    // be durable yet reported failed, and its retry would count its ids as duplicates.
    http::poll(Duration::from_secs(60), "10 inbox rows", || async {
        (inbox_rows(&url).await == Some(10)).then_some(())
    })
    .await;

    pg.stop_immediate();
    assert_eq!(readyz_becomes(addr, 503).await, "not ready: database\n");
    // Records that arrive during the outage: their batches fail and are retried (logged).
    for i in 10..20u32 {
        kafka.send_entry((i % 2) as i32, &uuid(i), 1, 10).await;
    }
    pg.start_server();
    readyz_becomes(addr, 200).await;
    http::poll(Duration::from_secs(60), "20 inbox rows", || async {
        (inbox_rows(&url).await == Some(20)).then_some(())
    })
    .await;
    let out = run.stop().await;
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(!all.contains(PW), "the password is in the output:\n{all}");
    assert!(
        all.contains("\"level\":\"DEBUG\""),
        "debug lines were written"
    );
    assert!(
        all.contains("not ready: database unreachable: "),
        "the reason is logged: {all}"
    );
    assert!(all.contains("records 20 new 20 "), "{}", out.stdout);
}

/// The start-up failures of `tests/it/startup.rs`, each with the password in the database URL:
/// a password refused by the server (in every URL form), a role without a grant, a SQL handler's
/// statement the role may not run, a schema behind. None shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_failures_show_no_password() {
    use crate::startup::{as_role, fresh_role, password_cluster, role_name, roles};
    let (pg, db) = password_cluster("the-Right-1").await;
    let host = format!("127.0.0.1:{}", pg.port);
    let forms = [
        format!("postgres://app:{PW}@{host}/{db}"),
        format!("postgresql://app@{host}/{db}?password={PW}"),
        format!(
            "host=127.0.0.1 port={} user=app password={PW} dbname={db}",
            pg.port
        ),
        format!(
            "host=127.0.0.1 port={} user=app password='{PW} with spaces' dbname={db}",
            pg.port
        ),
    ];
    for url in &forms {
        for args in [
            &["run", "--startup-timeout", "5s"][..],
            &["migrate"],
            &["cleanup", "--retention", "7d"],
        ] {
            let mut args = args.to_vec();
            args.extend(["--database-url", url]);
            let out = binary(&args, &[]);
            assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
            assert!(
                out.stderr
                    .contains("password authentication failed for user \"app\""),
                "{}",
                out.stderr
            );
            assert_hidden(&format!("{args:?}"), &out);
        }
    }
    // A role of the shared cluster (trusted: the URL's password is ignored) without a grant.
    let (url, pool) = fresh_db("secrets_grants").await;
    let role = role_name("secrets_grants_app");
    fresh_role(&role).await;
    let c = pool.get().await.unwrap();
    c.batch_execute(&roles::grants(&role)).await.unwrap();
    c.batch_execute(&format!("REVOKE INSERT ON balances FROM {role}"))
        .await
        .unwrap();
    let app = as_role(&url, &role).replacen(&format!("{role}@"), &format!("{role}:{PW}@"), 1);
    let upsert = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/sql/balances_upsert.sql"
    );
    let cases: [&[&str]; 3] = [
        &["run", "--brokers", "127.0.0.1:1"],
        &["dead-letters", "redrive"],
        &[
            "run",
            "--brokers",
            "127.0.0.1:1",
            "--handler",
            "sql",
            "--apply-sql",
            upsert,
        ],
    ];
    for args in cases {
        let mut args = args.to_vec();
        args.extend(["--database-url", &app]);
        let out = binary(&args, &[]);
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("balances"), "{}", out.stderr);
        assert_hidden(&format!("{args:?}"), &out);
    }
    // A schema behind.
    let (url, _pool) = common::empty_db("secrets_no_schema").await;
    let url = url.replacen("postgres@", &format!("postgres:{PW}@"), 1);
    for args in [
        &["run", "--brokers", "127.0.0.1:1"][..],
        &["dead-letters", "list"],
    ] {
        let mut args = args.to_vec();
        args.extend(["--database-url", &url]);
        let out = binary(&args, &[]);
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("run `batch-inbox migrate"),
            "{}",
            out.stderr
        );
        assert_hidden(&format!("{args:?}"), &out);
    }
}

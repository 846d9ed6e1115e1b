//! The config file, the environment and flags combined; bad files refused clearly; no secret in
//! any `Debug` form of what was read.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::cli::commands::Command as Sub;

const FILE: &str = r#"
batch-size = 500
batch-linger-ms = 7
pool-size = 3
topic = "from-file"
exit-on-eof = true
max-poison-rate = "5/10s"
statement-timeout = "2s"
partitioned = true   # a flag of `migrate`: ignored by `run`

[librdkafka]
"fetch.min.bytes" = 1
"client.id" = "file"
"sasl.password" = "hunter2"
"#;

fn write(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ops-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn source_of(settings: &[(String, String, Source)], name: &str) -> (String, Source) {
    let (_, value, source) = settings
        .iter()
        .find(|(n, _, _)| n == name)
        .unwrap_or_else(|| panic!("{name} missing from {settings:?}"));
    (value.clone(), *source)
}

/// In process, flags and the file (the environment's place between them is checked through the
/// binary below: this test binary's other tests run beside it, so it sets no variable).
#[test]
fn flags_beat_the_file_which_beats_defaults() {
    let path = write("combine", FILE);
    let loaded = load([
        "batch-inbox",
        "run",
        "--config",
        path.to_str().unwrap(),
        "--pool-size",
        "5",
        "-X",
        "client.id=flag",
    ]);
    let loaded = loaded.unwrap();
    let Sub::Run(run) = &loaded.cli.command else {
        panic!("not run")
    };
    let p = &run.pipeline;
    assert_eq!(p.batch_size.get(), 500, "file over default");
    assert_eq!(p.batch_linger_ms, Some(7), "file over default");
    assert_eq!(p.pool_size.get(), 5, "flag over file");
    assert_eq!(run.kafka.topics, ["from-file"]);
    assert_eq!(run.group, "batch-inbox", "default");
    assert!(run.exit_on_eof);
    let worker = run.processor().worker;
    let rate = worker.max_poison_rate.expect("a breaker");
    assert_eq!((rate.count, rate.per), (5, Duration::from_secs(10)));
    assert_eq!(
        run.processor().statement_timeout,
        Some(Duration::from_secs(2))
    );
    let config = run.processor().kafka.client_config();
    assert_eq!(config.get("fetch.min.bytes"), Some("1"));
    assert_eq!(
        config.get("client.id"),
        Some("flag"),
        "-X flag after the file"
    );

    let s = &loaded.settings;
    assert_eq!(source_of(s, "batch-size"), ("500".into(), Source::File));
    assert_eq!(source_of(s, "batch-linger-ms"), ("7".into(), Source::File));
    assert_eq!(source_of(s, "pool-size"), ("5".into(), Source::Flag));
    assert_eq!(
        source_of(s, "max-poison-rate"),
        ("5/10s".into(), Source::File)
    );
    assert_eq!(
        source_of(s, "group"),
        ("batch-inbox".into(), Source::Default)
    );
}

/// The `dead-letters` commands would not see the file's settings (its database URL among them):
/// they refuse it instead of re-driving against the default database.
#[test]
fn the_dead_letter_commands_refuse_a_config_file() {
    let path = write(
        "dead-letters",
        "database-url = \"postgres://elsewhere/db\"\n",
    );
    for sub in ["list", "redrive"] {
        let loaded = load([
            "batch-inbox",
            "dead-letters",
            sub,
            "--config",
            path.to_str().unwrap(),
        ]);
        let Err(err) = loaded else {
            panic!("{sub}: the file was accepted")
        };
        assert!(matches!(err, ConfigError::NotRead { .. }), "{sub}: {err}");
        assert!(err.to_string().contains("DATABASE_URL"), "{err}");
    }
}

/// One file serves both commands of a SQL handler's deployment: `handler` names `migrate`'s
/// handler too, and `apply-sql`, a flag of `run` alone, is ignored by `migrate`.
#[test]
fn the_files_handler_is_migrates_handler_too() {
    use crate::cli::handler::HandlerKind;
    let path = write("handler", "handler = \"sql\"\napply-sql = \"app.sql\"\n");
    let path = path.to_str().unwrap();
    let loaded = load(["batch-inbox", "migrate", "--config", path]).unwrap();
    let Sub::Migrate(migrate) = &loaded.cli.command else {
        panic!("not migrate")
    };
    assert_eq!(migrate.handler, HandlerKind::Sql);
    let loaded = load(["batch-inbox", "run", "--config", path]).unwrap();
    let Sub::Run(run) = &loaded.cli.command else {
        panic!("not run")
    };
    assert_eq!(run.handler.kind, HandlerKind::Sql);
    assert_eq!(run.handler.apply_sql[0].path, PathBuf::from("app.sql"));
    let loaded = load([
        "batch-inbox",
        "migrate",
        "--config",
        path,
        "--handler",
        "ledger",
    ]);
    let Sub::Migrate(migrate) = &loaded.unwrap().cli.command else {
        panic!("not migrate")
    };
    assert_eq!(
        migrate.handler,
        HandlerKind::Ledger,
        "the flag over the file"
    );
}

#[test]
fn an_unknown_key_is_refused_with_the_file_and_the_key() {
    let path = write("unknown", "batch-size = 10\nbatch-sise = 20\n");
    let err = load(["batch-inbox", "run", "--config", path.to_str().unwrap()]).unwrap_err();
    assert!(matches!(err, ConfigError::UnknownKey { ref key, .. } if key == "batch-sise"));
    let text = err.to_string();
    assert!(text.contains(path.to_str().unwrap()), "{text}");
    assert!(
        text.contains("unknown key `batch-sise`") && text.contains("batch-size"),
        "{text}"
    );
}

#[test]
fn file_values_are_validated_like_flags() {
    for (text, key, needle) in [
        ("batch-size = 0", "batch-size", "invalid value '0'"),
        ("mode = \"sometimes\"", "mode", "invalid value 'sometimes'"),
        (
            "batch-size = [1, 2]",
            "batch-size",
            "expected a string, number or boolean",
        ),
        (
            "exit-on-eof = \"yes\"",
            "exit-on-eof",
            "expected true or false",
        ),
        ("librdkafka = 3", "librdkafka", "expected a table"),
    ] {
        let path = write(key, text);
        let err = load(["batch-inbox", "run", "--config", path.to_str().unwrap()]).unwrap_err();
        match &err {
            ConfigError::Value {
                key: k, message, ..
            } => {
                assert_eq!(k, key, "{text}");
                assert!(message.contains(needle), "{text}: {message}");
            }
            other => panic!("{text}: {other}"),
        }
    }
    let path = write("toml", "batch-size = ");
    let err = load(["batch-inbox", "run", "--config", path.to_str().unwrap()]).unwrap_err();
    assert!(err.to_string().contains("is not valid TOML"), "{err}");
}

#[test]
fn sasl_ssl_settings_are_accepted_by_the_client() {
    let loaded = load([
        "batch-inbox",
        "run",
        "--brokers",
        "127.0.0.1:1",
        "-X",
        "security.protocol=SASL_SSL",
        "-X",
        "sasl.mechanisms=SCRAM-SHA-512",
        "-X",
        "sasl.username=ledger-app",
        "-X",
        "sasl.password=secret",
    ])
    .unwrap();
    let Sub::Run(run) = &loaded.cli.command else {
        panic!("not run")
    };
    let config = run.processor().kafka.client_config();
    // Creating the client validates every property (no broker is contacted yet): this fails
    // when the client library was built without OpenSSL.
    let consumer: Result<rdkafka::consumer::BaseConsumer, _> = config.create();
    assert!(consumer.is_ok(), "{:?}", consumer.err());
}

/// A password that must never be shown.
const PW: &str = "Sup3rS3cretPw";

#[test]
fn debug_of_the_configuration_types_hides_secrets() {
    let url = format!("postgres://app:{PW}@db/x");
    let sasl = format!("sasl.password={PW}");
    let pem = format!("ssl.key.pem={PW}");
    let loaded = load([
        "batch-inbox",
        "run",
        "--database-url",
        &url,
        "-X",
        &sasl,
        "-X",
        &pem,
        "-X",
        "client.id=visible",
    ])
    .unwrap();
    let Sub::Run(run) = &loaded.cli.command else {
        panic!("not run")
    };
    let processor = run.processor();
    for shown in [
        format!("{loaded:?}"),
        format!("{run:?}"),
        format!("{processor:?}"),
        format!("{:?}", processor.kafka),
    ] {
        assert!(!shown.contains(PW) && shown.contains("visible"), "{shown}");
    }
    assert_eq!(
        run.db.database_url.expose(),
        url,
        "the driver still gets it"
    );
}

// The reading rules, case by case.

use super::redact;
use clap::Arg;

#[test]
fn secrets_are_not_printed() {
    let url = Arg::new("database_url").long("database-url");
    let x = Arg::new("properties").short('X');
    let brokers = Arg::new("brokers").long("brokers");
    let secret = Arg::new("token").long("token").hide_env_values(true);
    for (arg, value, shown) in [
        (
            &url,
            "postgres://app:s3cr%40t@db:5432/x?sslmode=require",
            "postgres://app:***@db:5432/x?sslmode=require",
        ),
        (&url, "postgres://app@db/x", "postgres://app@db/x"),
        (
            &url,
            "postgres://db/x?password=pw",
            "postgres://db/x?password=***",
        ),
        (&url, "host=db password='p w'", "host=db password=***"),
        (&x, "sasl.password=hunter2", "sasl.password=***"),
        (&x, "ssl.key.pem=-----BEGIN", "ssl.key.pem=***"),
        (
            &x,
            "sasl.oauthbearer.config=a b",
            "sasl.oauthbearer.config=***",
        ),
        (&x, "fetch.min.bytes=1", "fetch.min.bytes=1"),
        (&brokers, "127.0.0.1:9092", "127.0.0.1:9092"),
        (&brokers, "x://u:pw@h", "x://u:***@h"),
        (&secret, "pw", "***"),
    ] {
        assert_eq!(redact(arg, value), shown, "{value}");
    }
}

#[test]
fn repeatable_flags_take_arrays_or_comma_strings() {
    let run = |text: &str, extra: &[&str]| {
        let path = write(&format!("repeat-{}", text.len()), text);
        let mut args = vec!["batch-inbox", "run", "--config", path.to_str().unwrap()];
        args.extend(extra);
        let loaded = load(args).unwrap();
        let Sub::Run(run) = loaded.cli.command else {
            panic!("not run")
        };
        *run
    };
    let a = run(
        r#"
handler = "sql"
topic = ["orders", "refunds"]
apply-sql = ["orders=o.sql", "r.sql"]
tombstones = "dead-letter"
value-format = "text"
id-from = "key"
id-format = "any"
"#,
        &[],
    );
    assert_eq!(a.kafka.topics, ["orders", "refunds"]);
    let applied: Vec<(Option<&str>, &str)> = a
        .handler
        .apply_sql
        .iter()
        .map(|s| (s.topic.as_deref(), s.path.to_str().unwrap()))
        .collect();
    assert_eq!(applied, [(Some("orders"), "o.sql"), (None, "r.sql")]);
    assert_eq!(a.check_handler(), Ok(()));
    let p = a.processor();
    assert_eq!(p.kafka.topics, ["orders", "refunds"]);
    assert_eq!(
        (p.decoding.tombstones, p.decoding.values),
        (
            batch_inbox::Tombstones::DeadLetter,
            batch_inbox::ValueFormat::Text
        )
    );
    assert_eq!(p.decoding.ids.source, batch_inbox::IdSource::Key);
    assert_eq!(p.decoding.ids.format, batch_inbox::IdFormat::Any);
    let b = run(
        "handler = \"sql\"\ntopic = \"a,b,a\"\napply-sql = \"x.sql\"\n",
        &[],
    );
    assert_eq!(b.kafka.topics, ["a", "b", "a"]);
    assert_eq!(b.processor().kafka.topics, ["a", "b"], "each topic once");
    let flags_win = run("topic = [\"a\", \"b\"]\n", &["--topic", "c"]);
    assert_eq!(flags_win.kafka.topics, ["c"]);
    let path = write("bad-topic", "topic = [\"a\", \"no spaces\"]\n");
    let err = load(["batch-inbox", "run", "--config", path.to_str().unwrap()]).unwrap_err();
    assert!(err.to_string().contains("not a Kafka topic name"), "{err}");
}

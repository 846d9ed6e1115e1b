//! A config file, environment variables and flags combine, flags winning over the environment,
//! the environment over the file, the file over the defaults; bad files are refused clearly.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use batch_inbox::internal::config::Command as Sub;
use batch_inbox::internal::config_file::{load, ConfigError, Source};

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
    assert_eq!(run.kafka.topic, "from-file");
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
    use batch_inbox::internal::config::HandlerKind;
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
    assert_eq!(run.handler.apply_sql, Some(PathBuf::from("app.sql")));
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

fn binary(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_batch-inbox"));
    cmd.args(args);
    for var in [
        "BATCH_INBOX_BATCH_LINGER_MS",
        "BATCH_INBOX_POOL_SIZE",
        "BATCH_INBOX_CONFIG",
        "BATCH_INBOX_BATCH_SIZE",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binary_combines_file_env_and_flags() {
    let path = write("binary", FILE);
    let (code, out, err) = binary(
        &["run", "--pool-size", "5", "--print-config"],
        &[
            ("BATCH_INBOX_CONFIG", path.to_str().unwrap()),
            ("BATCH_INBOX_BATCH_LINGER_MS", "9"),
            ("BATCH_INBOX_POOL_SIZE", "4"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    for line in [
        "batch-size = \"500\"  # file",
        "batch-linger-ms = \"9\"  # env",
        "pool-size = \"5\"  # flag",
        "topic = \"from-file\"  # file",
        "group = \"batch-inbox\"  # default",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "{line} missing from:\n{out}"
        );
    }
    assert!(
        out.contains("sasl.password=***") && !out.contains("hunter2"),
        "secrets are not printed: {out}"
    );

    let bad = write("binary-bad", "batch-sise = 3\n");
    let (code, _, err) = binary(&["run", "--config", bad.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: config file ") && err.contains("unknown key `batch-sise`"));
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

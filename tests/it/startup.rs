//! Start-up failures of the database end with exit 1 and one line naming the cause, as a person
//! would write it, before anything is consumed: no schema (run `migrate` first), a refused
//! connection (host and port once, after `--startup-timeout`), a wrong password, a role that
//! lacks a grant (the table and the privilege), a role that does not own a partitioned inbox.
//! A database that comes up within the timeout is
//! waited for. The least-privilege role of docs/OPERATIONS.md runs the whole pipeline, the
//! retention cleanup and a redrive (`roles`).

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{self, db_name, empty_db, fresh_db, postgres::PrivatePostgres};

pub(crate) mod roles;

/// What a finished run of the binary wrote, and its exit code.
pub(crate) struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// The lines of stderr that are the binary's error, not its log.
    pub fn errors(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("error: "))
            .collect()
    }

    /// The one error line (and exit 1): fails unless there is exactly one.
    #[track_caller]
    pub fn failure(&self) -> &str {
        assert_eq!(self.code, 1, "{}\n{}", self.stdout, self.stderr);
        match self.errors()[..] {
            [line] => line,
            _ => panic!("not one error line:\n{}", self.stderr),
        }
    }
}

/// Runs the binary to its end with `args` and `env` (and none of the caller's settings).
pub(crate) fn binary(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_batch-inbox"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("BATCH_INBOX_")
            || ["DATABASE_URL", "KAFKA_BROKERS", "RUST_LOG"].contains(&k.as_str())
        {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("the binary runs");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A port on 127.0.0.1 where nothing listens.
pub(crate) fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A SQL handler's statement of the examples.
const UPSERT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/sql/balances_upsert.sql"
);

const CORE_BEHIND: &str = "error: database schema: the core's tables are at version 0, this \
     binary needs 8: run `batch-inbox migrate` (`batch-inbox migrate --handler sql` for the \
     core's tables alone)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_without_tables_says_to_run_migrate_first() {
    let (url, _pool) = empty_db("startup_no_schema").await;
    let ledger = "error: database schema: the core's tables are at version 0, this binary needs \
                  8: run `batch-inbox migrate --handler ledger`";
    let sql = "error: database schema: the core's tables are at version 0, this binary needs 8: \
               run `batch-inbox migrate --handler sql`";
    let cases: [(&[&str], &str); 6] = [
        (&["run", "--brokers", "127.0.0.1:1"], ledger),
        (
            &[
                "run",
                "--handler",
                "sql",
                "--apply-sql",
                UPSERT,
                "--brokers",
                "127.0.0.1:1",
            ],
            sql,
        ),
        (&["cleanup", "--retention", "7d"], CORE_BEHIND),
        (&["dead-letters", "list"], CORE_BEHIND),
        (&["dead-letters", "redrive"], ledger),
        (&["dead-letters", "redrive", "--dry-run"], ledger),
    ];
    for (args, line) in cases {
        let mut args = args.to_vec();
        args.extend(["--database-url", &url]);
        let out = binary(&args, &[]);
        assert_eq!(out.failure(), line, "{args:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {}", out.stderr);
    }
    // The ledger's tables alone are missing: the same line names the ledger's.
    let (url, _pool) = common::fresh_core_db("startup_no_ledger").await;
    let out = binary(
        &["run", "--database-url", &url, "--brokers", "127.0.0.1:1"],
        &[],
    );
    assert_eq!(
        out.failure(),
        "error: database schema: the ledger's tables are at version 0, this binary needs 2: run \
         `batch-inbox migrate --handler ledger`"
    );
}

#[test]
fn a_refused_connection_is_retried_for_the_startup_timeout_then_named_once() {
    let port = closed_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/none");
    let started = Instant::now();
    let out = binary(
        &["run", "--database-url", &url, "--startup-timeout", "2s"],
        &[],
    );
    let took = started.elapsed();
    assert_eq!(
        out.failure(),
        format!(
            "error: cannot connect to the database at 127.0.0.1:{port}: Connection refused (os \
             error 111) (still failing after --startup-timeout 2s)"
        )
    );
    assert!(took >= Duration::from_secs(2), "gave up after {took:?}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    // Said once while it waits, at info level.
    let waiting: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("retrying for at most 2 s"))
        .collect();
    assert_eq!(waiting.len(), 1, "{}", out.stderr);
    // The one-shot commands do not wait.
    for args in [
        &["migrate"][..],
        &["cleanup", "--retention", "7d"],
        &["dead-letters", "list"],
        &["dead-letters", "redrive"],
    ] {
        let mut args = args.to_vec();
        args.extend(["--database-url", &url]);
        let out = binary(&args, &[]);
        assert_eq!(
            out.failure(),
            format!(
                "error: cannot connect to the database at 127.0.0.1:{port}: Connection refused \
                 (os error 111)"
            ),
            "{args:?}"
        );
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    }
    // The environment and the config file set it too.
    let file = std::env::temp_dir().join(format!("startup-{}.toml", std::process::id()));
    std::fs::write(&file, "startup-timeout = \"1s\"\n").unwrap();
    let from_file = binary(
        &[
            "run",
            "--database-url",
            &url,
            "--config",
            file.to_str().unwrap(),
        ],
        &[],
    );
    let from_env = binary(
        &["run", "--database-url", &url],
        &[("BATCH_INBOX_STARTUP_TIMEOUT", "1s")],
    );
    std::fs::remove_file(&file).unwrap();
    for out in [from_file, from_env] {
        assert!(
            out.failure()
                .ends_with("(still failing after --startup-timeout 1s)"),
            "{}",
            out.stderr
        );
    }
    // Zero: one attempt.
    let out = binary(
        &["run", "--database-url", &url, "--startup-timeout", "0"],
        &[],
    );
    assert!(
        out.failure().starts_with(&format!(
            "error: cannot connect to the database at 127.0.0.1:{port}: Connection refused"
        )),
        "{}",
        out.stderr
    );
}

#[test]
fn several_hosts_are_each_named_with_their_port() {
    let (a, b) = (closed_port(), closed_port());
    let url = format!("host=127.0.0.1,127.0.0.1 port={a},{b} user=postgres password=pw dbname=x");
    let out = binary(&["migrate", "--database-url", &url], &[]);
    assert!(
        out.failure().starts_with(&format!(
            "error: cannot connect to the database at 127.0.0.1:{a},127.0.0.1:{b}: "
        )),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_comes_up_within_the_startup_timeout_is_waited_for() {
    let pg = PrivatePostgres::start();
    let url = pg.url("postgres");
    let pool = batch_inbox::db::connect(&url, 1).await.unwrap();
    batch_inbox::db::migrate(&pool).await.unwrap();
    batch_inbox::ledger::migrate(&pool).await.unwrap();
    drop(pool);
    pg.stop_immediate();
    let kafka = common::Kafka::new("startup_late", 1);
    kafka.send_entry(0, &common::uuid(1), 5, 40).await;
    let args = [
        "run",
        "--database-url",
        &url,
        "--brokers",
        &kafka.brokers,
        "--topic",
        &kafka.topic,
        "--exit-on-eof",
        "--startup-timeout",
        "60s",
    ];
    let run = crate::common::child::Running::spawn(&args, &[]);
    // The processor waits for the database: started only once it has said so.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !run
        .stderr_lines()
        .iter()
        .any(|l| l.contains("retrying for at most 60 s"))
    {
        assert!(Instant::now() < deadline, "{:?}", run.stderr_lines());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pg.start_server();
    let done = run.wait(Duration::from_secs(90)).await;
    assert_eq!(done.code, Some(0), "{}\n{}", done.stdout, done.stderr);
    assert!(done.stdout.contains("records 1 new 1 "), "{}", done.stdout);
    let pool = batch_inbox::db::connect(&url, 1).await.unwrap();
    let amount: i64 = pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT amount FROM balances WHERE account_id = 5", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(amount, 40);
}

/// Writes `lines` as the whole `pg_hba.conf` of the cluster `pool` is connected to (as its
/// superuser) and reloads it.
pub(crate) async fn set_hba(pool: &deadpool_postgres::Pool, lines: &[&str]) {
    let c = pool.get().await.unwrap();
    let file: String = c.query_one("SHOW hba_file", &[]).await.unwrap().get(0);
    let values: Vec<String> = lines
        .iter()
        .map(|l| format!("('{}')", l.replace('\'', "''")))
        .collect();
    c.batch_execute(&format!(
        "COPY (SELECT * FROM (VALUES {}) AS v(line)) TO '{file}'",
        values.join(", ")
    ))
    .await
    .unwrap();
    let ok: bool = c
        .query_one("SELECT pg_reload_conf()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(ok);
    // The reload is asynchronous: wait until the server reads the new file.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rules: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_hba_file_rules WHERE error IS NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if rules == lines.len() as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "pg_hba.conf not read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A private cluster whose role `app` needs a SCRAM password over TCP (the others are trusted
/// over the socket and TCP); returns it with the superuser's pool and the database's name.
pub(crate) async fn password_cluster(password: &str) -> (PrivatePostgres, String) {
    let pg = PrivatePostgres::start();
    let pool = batch_inbox::db::connect(&pg.url("postgres"), 1)
        .await
        .unwrap();
    let c = pool.get().await.unwrap();
    c.batch_execute(&format!(
        "SET password_encryption = 'scram-sha-256'; CREATE ROLE app LOGIN PASSWORD '{password}'"
    ))
    .await
    .unwrap();
    c.batch_execute("CREATE DATABASE app OWNER app")
        .await
        .unwrap();
    drop(c);
    set_hba(
        &pool,
        &[
            "local all all trust",
            "host all app 127.0.0.1/32 scram-sha-256",
            "host all all 127.0.0.1/32 trust",
        ],
    )
    .await;
    (pg, "app".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_at_once_naming_the_user_never_the_password() {
    let (pg, db) = password_cluster("right-Pw-1").await;
    let wrong = "Wr0ngPassw0rd";
    let url = format!("postgres://app:{wrong}@127.0.0.1:{}/{db}", pg.port);
    let expected = format!(
        "error: cannot connect to the database at 127.0.0.1:{}: password authentication failed \
         for user \"app\"",
        pg.port
    );
    let started = Instant::now();
    let run = binary(&["run", "--database-url", &url], &[]);
    assert_eq!(run.failure(), expected);
    // Not retried: a password does not get right by waiting.
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!run.stderr.contains("retrying"), "{}", run.stderr);
    let migrate = binary(&["migrate", "--database-url", &url], &[]);
    assert_eq!(migrate.failure(), expected);
    for out in [&run, &migrate] {
        assert!(!out.stderr.contains(wrong) && !out.stdout.contains(wrong));
    }
    // The right password works.
    let url = format!("postgres://app:right-Pw-1@127.0.0.1:{}/{db}", pg.port);
    let out = binary(&["migrate", "--database-url", &url], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// The test databases' prefix-scoped name of a role (roles are the cluster's, not a
/// database's).
pub(crate) fn role_name(name: &str) -> String {
    db_name(name)
}

/// Drops `role` if it exists (its grants went with its test database, dropped first) and
/// creates it with LOGIN and no privilege.
pub(crate) async fn fresh_role(role: &str) {
    let admin = batch_inbox::db::connect(&common::db_url("postgres"), 1)
        .await
        .unwrap();
    let c = admin.get().await.unwrap();
    c.batch_execute(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN"
    ))
    .await
    .unwrap();
}

/// The URL of test database `url` as `role`.
pub(crate) fn as_role(url: &str, role: &str) -> String {
    url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_a_grant_fails_at_start_naming_the_table_and_the_privilege() {
    let (url, pool) = fresh_db("startup_grants").await;
    let role = role_name("startup_grants_app");
    fresh_role(&role).await;
    let c = pool.get().await.unwrap();
    c.batch_execute(&roles::grants(&role)).await.unwrap();
    let app = as_role(&url, &role);
    let run: &[&str] = &["run", "--brokers", "127.0.0.1:1", "--startup-timeout", "5s"];
    let retention: &[&str] = &[
        "run",
        "--brokers",
        "127.0.0.1:1",
        "--startup-timeout",
        "5s",
        "--retention",
        "7d",
    ];
    let cases: Vec<(&str, &str, &[&str], &str)> = vec![
        ("schema_migrations", "SELECT", run, "run"),
        ("inbox", "SELECT", run, "run"),
        ("inbox", "INSERT", run, "run"),
        ("dead_letters", "SELECT", run, "run"),
        ("dead_letters", "INSERT", run, "run"),
        ("consumer_offsets", "SELECT", run, "run"),
        ("consumer_offsets", "INSERT", run, "run"),
        ("consumer_offsets", "UPDATE", run, "run"),
        ("consumer_topics", "SELECT", run, "run"),
        ("consumer_topics", "INSERT", run, "run"),
        ("consumer_topics", "UPDATE", run, "run"),
        ("balances", "SELECT", run, "run"),
        ("balances", "INSERT", run, "run"),
        ("balances", "UPDATE", run, "run"),
        ("inbox", "DELETE", retention, "run"),
        ("inbox", "UPDATE", retention, "run"),
        (
            "inbox",
            "DELETE",
            &["cleanup", "--retention", "7d"],
            "cleanup",
        ),
        (
            "inbox",
            "UPDATE",
            &["cleanup", "--retention", "7d"],
            "cleanup",
        ),
        (
            "schema_migrations",
            "SELECT",
            &["cleanup", "--retention", "7d"],
            "cleanup",
        ),
        (
            "dead_letters",
            "SELECT",
            &["dead-letters", "list"],
            "dead-letters list",
        ),
        (
            "dead_letters",
            "UPDATE",
            &["dead-letters", "redrive"],
            "dead-letters redrive",
        ),
        (
            "inbox",
            "DELETE",
            &["dead-letters", "redrive"],
            "dead-letters redrive",
        ),
        (
            "inbox",
            "INSERT",
            &["dead-letters", "redrive"],
            "dead-letters redrive",
        ),
        (
            "balances",
            "UPDATE",
            &["dead-letters", "redrive"],
            "dead-letters redrive",
        ),
    ];
    for (table, privilege, args, command) in cases {
        c.batch_execute(&format!("REVOKE {privilege} ON {table} FROM {role}"))
            .await
            .unwrap();
        let mut args = args.to_vec();
        args.extend(["--database-url", &app]);
        let out = binary(&args, &[]);
        assert_eq!(
            out.failure(),
            format!(
                "error: the database role \"{role}\" lacks {privilege} on table {table}, which \
                 `{command}` needs: GRANT {privilege} ON {table} TO \"{role}\" \
                 (docs/OPERATIONS.md, \"Database roles and grants\")"
            ),
            "{args:?}"
        );
        c.batch_execute(&format!("GRANT {privilege} ON {table} TO {role}"))
            .await
            .unwrap();
    }
    // Nothing was written by the probes.
    let t = common::tables(&pool).await;
    assert!(t.inbox.is_empty() && t.balances.is_empty() && t.dead_letters.is_empty());
    let offsets: i64 = c
        .query_one("SELECT count(*) FROM consumer_offsets", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(offsets, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_inbox_needs_its_owner_for_run_and_cleanup() {
    let (url, pool) = fresh_db("startup_partitioned_owner").await;
    let out = binary(&["migrate", "--partitioned", "--database-url", &url], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let role = role_name("startup_partitioned_owner_app");
    fresh_role(&role).await;
    let c = pool.get().await.unwrap();
    c.batch_execute(&roles::grants(&role)).await.unwrap();
    let app = as_role(&url, &role);
    let cases: [(&[&str], &str); 2] = [
        (&["run", "--brokers", "127.0.0.1:1"], "run"),
        (&["cleanup", "--retention", "7d"], "cleanup"),
    ];
    for (args, command) in cases {
        let mut args = args.to_vec();
        args.extend(["--database-url", &app]);
        let out = binary(&args, &[]);
        assert_eq!(
            out.failure(),
            format!(
                "error: the database role \"{role}\" cannot run the partitioned inbox's upkeep \
                 (creating, attaching and dropping its partitions), which `{command}` needs: \
                 only the inbox's owner \"postgres\" or a member of it may (docs/OPERATIONS.md, \
                 \"Database roles and grants\")"
            )
        );
    }
    // A member of the owning role may.
    c.batch_execute(&format!("GRANT postgres TO {role}"))
        .await
        .unwrap();
    let out = binary(
        &["cleanup", "--retention", "7d", "--database-url", &app],
        &[],
    );
    c.batch_execute(&format!("REVOKE postgres FROM {role}"))
        .await
        .unwrap();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("removed 0 rows "), "{}", out.stdout);
}

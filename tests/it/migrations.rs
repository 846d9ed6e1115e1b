//! Migrations by owner: `migrate --handler sql` creates the core's tables and none of the
//! ledger's, `run` checks the tables its handler needs and names the `migrate` that is missing,
//! a second migrate changes nothing, and concurrent migrates apply each migration once. The
//! upgrade of a database recorded before owners: module `before_owners`.

use std::time::{Duration, SystemTime};

use crate::common::child::{Finished, Running};
use crate::common::{empty_db, uuid, Kafka};
use batch_inbox::{db, ledger};
use deadpool_postgres::Pool;

mod before_owners;

/// A row of `schema_migrations`: owner, version, name, applied_at.
pub(crate) type Recorded = (String, i32, String, SystemTime);

/// Every row of `schema_migrations`, by owner and version.
pub(crate) async fn recorded(pool: &Pool) -> Vec<Recorded> {
    let c = pool.get().await.unwrap();
    c.query(
        "SELECT owner, version, name, applied_at FROM schema_migrations ORDER BY owner, version",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// (owner, version, name) of `rows`.
pub(crate) fn versions(rows: &[Recorded]) -> Vec<(String, i32, String)> {
    rows.iter()
        .map(|(o, v, n, _)| (o.clone(), *v, n.clone()))
        .collect()
}

/// (owner, version, name) of every migration of `owners` (`core`, `ledger`), in order.
pub(crate) fn latest(owners: &[&str]) -> Vec<(String, i32, String)> {
    let mut out = Vec::new();
    for owner in owners {
        let list = match *owner {
            db::CORE => db::MIGRATIONS,
            ledger::OWNER => ledger::MIGRATIONS,
            other => panic!("no owner {other}"),
        };
        out.extend(
            list.iter()
                .map(|m| (owner.to_string(), m.version, m.name.to_owned())),
        );
    }
    out
}

/// The tables, indexes and their storage options of the public schema.
pub(crate) async fn relations(pool: &Pool) -> Vec<(String, String, Option<Vec<String>>)> {
    let c = pool.get().await.unwrap();
    c.query(
        "SELECT relname::text, relkind::text, reloptions FROM pg_class
         WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p', 'i')
         ORDER BY relname",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// The names of the public schema's tables.
pub(crate) async fn tables(pool: &Pool) -> Vec<String> {
    relations(pool)
        .await
        .into_iter()
        .filter(|(_, kind, _)| kind != "i")
        .map(|(name, _, _)| name)
        .collect()
}

/// `batch-inbox ARGS` with `env` and nothing of the caller's environment; at most 60 s.
pub(crate) async fn binary(args: &[&str], env: &[(&str, &str)]) -> Finished {
    Running::spawn(args, env)
        .wait(Duration::from_secs(60))
        .await
}

const CORE_TABLES: [&str; 6] = [
    "consumer_offset_changes",
    "consumer_offsets",
    "consumer_topics",
    "dead_letters",
    "inbox",
    "schema_migrations",
];

#[tokio::test]
async fn migrate_handler_sql_creates_the_core_tables_and_no_balances() {
    let (url, pool) = empty_db("mig_sql").await;
    let out = binary(
        &["migrate", "--handler", "sql", "--database-url", &url],
        &[],
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "core migrations applied: [1, 2, 3, 4, 5, 6, 7, 8]"
    );
    assert_eq!(tables(&pool).await, CORE_TABLES);
    assert_eq!(versions(&recorded(&pool).await), latest(&[db::CORE]));
    db::check_schema(&pool).await.unwrap();
    let err = ledger::check_schema(&pool).await.unwrap_err();
    assert!(
        matches!(
            err,
            batch_inbox::DbError::Schema {
                owner: "ledger",
                have: 0,
                want: 2,
                ..
            }
        ),
        "{err}"
    );
}

/// `BATCH_INBOX_HANDLER`, which also names `run`'s handler, names `migrate`'s; the default is
/// the ledger, which adds `balances`.
#[tokio::test]
async fn migrate_takes_its_handler_from_the_environment_and_defaults_to_the_ledger() {
    let (url, pool) = empty_db("mig_env").await;
    let env = [
        ("BATCH_INBOX_HANDLER", "sql"),
        ("DATABASE_URL", url.as_str()),
    ];
    let out = binary(&["migrate"], &env).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(tables(&pool).await, CORE_TABLES);

    let out = binary(&["migrate", "--database-url", &url], &[]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "core migrations applied: []\nledger migrations applied: [1, 2]"
    );
    let mut with_ledger = CORE_TABLES.to_vec();
    with_ledger.insert(0, "balances");
    assert_eq!(tables(&pool).await, with_ledger);
    assert_eq!(
        versions(&recorded(&pool).await),
        latest(&[db::CORE, ledger::OWNER])
    );
}

/// A database of the SQL handler: `run --handler sql` applies a topic to it, through the binary,
/// and it still has no ledger table afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_handler_sql_applies_a_topic_to_a_database_without_the_ledger() {
    let (url, pool) = empty_db("mig_sql_run").await;
    let out = binary(
        &["migrate", "--handler", "sql", "--database-url", &url],
        &[],
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let c = pool.get().await.unwrap();
    c.batch_execute(
        "CREATE TABLE amounts (message_id uuid PRIMARY KEY, account_id bigint NOT NULL,
                               amount bigint NOT NULL)",
    )
    .await
    .unwrap();
    let sql = std::env::temp_dir().join(format!("mig-sql-run-{}.sql", std::process::id()));
    std::fs::write(
        &sql,
        "INSERT INTO amounts (message_id, account_id, amount)
         SELECT m.id, (m.value ->> 'account_id')::bigint, (m.value ->> 'amount')::bigint
         FROM jsonb_to_recordset($1) AS m(id uuid, value jsonb)",
    )
    .unwrap();
    let kafka = Kafka::new("mig-sql-run", 2);
    for i in 0..20u32 {
        kafka
            .send_entry((i % 2) as i32, &uuid(i), i64::from(i % 3), 10)
            .await;
    }
    for i in [3u32, 4] {
        kafka
            .send_entry((i % 2) as i32, &uuid(i), i64::from(i % 3), 10)
            .await; // duplicates
    }
    let out = binary(
        &[
            "run",
            "--handler",
            "sql",
            "--apply-sql",
            sql.to_str().unwrap(),
            "--database-url",
            &url,
            "--brokers",
            &kafka.brokers,
            "--topic",
            "mig-sql-run",
            "--group",
            "mig-sql-run",
            "--exit-on-eof",
            "--log-interval",
            "0",
        ],
        &[("RUST_LOG", "warn")],
    )
    .await;
    std::fs::remove_file(&sql).unwrap();
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let row = c
        .query_one(
            "SELECT (SELECT count(*) FROM inbox), (SELECT count(*) FROM amounts),
                    (SELECT sum(amount) FROM amounts)::bigint,
                    (SELECT count(*) FROM dead_letters)",
            &[],
        )
        .await
        .unwrap();
    let counts: (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(counts, (20, 20, 200, 0));
    let mut app = CORE_TABLES.to_vec();
    app.insert(0, "amounts");
    assert_eq!(tables(&pool).await, app, "no balances");
    assert_eq!(versions(&recorded(&pool).await), latest(&[db::CORE]));
}

/// `run` checks the tables of its handler before anything is consumed (the broker is
/// unreachable: it is never asked), and names the `migrate` of that handler.
#[tokio::test]
async fn run_on_a_schema_behind_names_the_migrate_of_its_handler() {
    let (url, pool) = empty_db("mig_run_behind").await;
    let run = |handler: &'static str| {
        let url = url.clone();
        async move {
            let mut args = vec!["run", "--database-url", &url, "--brokers", "127.0.0.1:1"];
            args.extend(["--exit-on-eof", "--handler", handler]);
            if handler == "sql" {
                args.extend(["--apply-sql", "never-read.sql"]);
            }
            let out = binary(&args, &[]).await;
            assert_eq!(out.code, Some(1), "{}", out.stderr);
            out.stderr
        }
    };
    assert_eq!(
        run("sql").await,
        "error: database schema: the core's tables are at version 0, this binary needs 8: run \
         `batch-inbox migrate --handler sql`"
    );
    assert_eq!(
        run("ledger").await,
        "error: database schema: the core's tables are at version 0, this binary needs 8: run \
         `batch-inbox migrate --handler ledger`"
    );
    let out = binary(
        &["migrate", "--handler", "sql", "--database-url", &url],
        &[],
    )
    .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        run("ledger").await,
        "error: database schema: the ledger's tables are at version 0, this binary needs 2: run \
         `batch-inbox migrate --handler ledger`"
    );
    // The SQL handler's run passes the check and reads its statement file next.
    let err = run("sql").await;
    assert!(
        err.starts_with("error: --apply-sql never-read.sql"),
        "{err}"
    );
    assert_eq!(tables(&pool).await, CORE_TABLES, "a run creates nothing");
}

#[tokio::test]
async fn migrating_twice_changes_nothing() {
    let (url, pool) = empty_db("mig_twice").await;
    for handler in ["sql", "ledger"] {
        let args = ["migrate", "--handler", handler, "--database-url", &url];
        let first = binary(&args, &[]).await;
        assert_eq!(first.code, Some(0), "{}", first.stderr);
        let (rows, rels) = (recorded(&pool).await, relations(&pool).await);
        let again = binary(&args, &[]).await;
        assert_eq!(again.code, Some(0), "{}", again.stderr);
        let expected = match handler {
            "sql" => "core migrations applied: []",
            _ => "core migrations applied: []\nledger migrations applied: []",
        };
        assert_eq!(again.stdout, expected);
        assert_eq!(
            recorded(&pool).await,
            rows,
            "{handler}: the same rows, applied_at too"
        );
        assert_eq!(
            relations(&pool).await,
            rels,
            "{handler}: the same tables and indexes"
        );
    }
    // The SQL handler's migrate leaves the ledger's tables and versions of a ledger database.
    let out = binary(
        &["migrate", "--handler", "sql", "--database-url", &url],
        &[],
    )
    .await;
    assert_eq!(out.stdout, "core migrations applied: []");
    assert_eq!(
        versions(&recorded(&pool).await),
        latest(&[db::CORE, ledger::OWNER])
    );
}

/// Eight migrates at once, four of each owner, on eight connections: the advisory lock lets one
/// of each owner apply its migrations, the others find them applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrates_apply_each_migration_once() {
    let (_url, pool) = empty_db("mig_concurrent").await;
    let results = migrate_at_once(&pool).await;
    let mut core: Vec<Vec<i32>> = results.iter().step_by(2).cloned().collect();
    let mut ledger: Vec<Vec<i32>> = results.iter().skip(1).step_by(2).cloned().collect();
    core.sort();
    ledger.sort();
    assert_eq!(core, [vec![], vec![], vec![], vec![1, 2, 3, 4, 5, 6, 7, 8]]);
    assert_eq!(ledger, [vec![], vec![], vec![], vec![1, 2]]);
    assert_eq!(
        versions(&recorded(&pool).await),
        latest(&[db::CORE, ledger::OWNER])
    );
}

/// `db::migrate` and `ledger::migrate` alternately, eight at once (released together), in that
/// order of results.
pub(crate) async fn migrate_at_once(pool: &Pool) -> Vec<Vec<i32>> {
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (pool, start) = (pool.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                match i % 2 {
                    0 => db::migrate(&pool).await,
                    _ => ledger::migrate(&pool).await,
                }
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap().expect("a concurrent migrate succeeds"));
    }
    results
}

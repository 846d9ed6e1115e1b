//! The least-privilege role of docs/OPERATIONS.md ("Database roles and grants"): with exactly
//! the grants listed there (copied below, and checked against the document), the ledger pipeline
//! drains a real broker's topic (`KAFKA_BROKERS`) to the exact balances, `cleanup` removes the
//! expired rows of a plain inbox, `dead-letters redrive` applies what was parked and `list`
//! shows it; the SQL
//! handler's statement on a table the role may not write fails at start.

use batch_inbox_tools::generate::{generate, GeneratorSettings};
use batch_inbox_tools::verify::{differences, observe};

use super::{as_role, binary, fresh_role, role_name};
use crate::common::broker::Broker;
use crate::common::{self, fresh_core_db, fresh_db, uuid};

/// The grants of docs/OPERATIONS.md, for `role`: every statement of the document's block.
pub(crate) fn grants(role: &str) -> String {
    GRANTS.replace("batch_inbox_app", role)
}

/// The block of docs/OPERATIONS.md, as it is there (a test below compares them).
const GRANTS: &str = "\
-- every command but migrate: the schema's versions
GRANT SELECT ON schema_migrations TO batch_inbox_app;
-- run (any handler)
GRANT SELECT, INSERT ON inbox, dead_letters TO batch_inbox_app;
GRANT SELECT, INSERT, UPDATE ON consumer_offsets, consumer_topics TO batch_inbox_app;
-- run --handler ledger (and its dead-letters redrive)
GRANT SELECT, INSERT, UPDATE ON balances TO batch_inbox_app;
-- run --retention and cleanup, on a plain inbox
GRANT UPDATE, DELETE ON inbox TO batch_inbox_app;
-- dead-letters redrive (besides the handler's tables)
GRANT UPDATE ON dead_letters TO batch_inbox_app;
GRANT DELETE ON inbox TO batch_inbox_app;
";

#[test]
fn the_grants_are_those_of_the_operations_guide() {
    let doc = include_str!("../../../docs/OPERATIONS.md");
    assert!(
        doc.contains(GRANTS),
        "docs/OPERATIONS.md lacks the block:\n{GRANTS}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listed_grants_run_the_pipeline_the_cleanup_and_a_redrive() {
    let broker = Broker::start();
    let (url, pool) = fresh_db("startup_role_pipeline").await;
    let role = role_name("startup_role_pipeline_app");
    fresh_role(&role).await;
    let owner = pool.get().await.unwrap();
    owner.batch_execute(&grants(&role)).await.unwrap();
    let app = as_role(&url, &role);

    // The pipeline: generated records (duplicates, bad input, overdrafts), v4 ids.
    let topic = broker.topic("role");
    batch_inbox_tools::produce::ensure_topic(&broker.addr, &topic, 4)
        .await
        .unwrap();
    let (records, expected) = generate(GeneratorSettings {
        messages: 5_000,
        accounts: 100,
        duplicate_ratio: 0.15,
        bad_ratio: 0.02,
        id_version: 4,
        ..GeneratorSettings::default()
    });
    let producer = batch_inbox_tools::produce::producer(&broker.addr, &[]).unwrap();
    batch_inbox_tools::produce::send_all(&producer, &topic, records)
        .await
        .unwrap();
    let group = Broker::group(&topic, "app");
    let run = |topic: String| {
        let (app, brokers, group) = (app.clone(), broker.addr.clone(), group.clone());
        tokio::task::spawn_blocking(move || {
            binary(
                &[
                    "run",
                    "--database-url",
                    &app,
                    "--brokers",
                    &brokers,
                    "--topic",
                    &topic,
                    "--group",
                    &group,
                    "--exit-on-eof",
                ],
                &[("RUST_LOG", "warn")],
            )
        })
    };
    let out = run(topic.clone()).await.unwrap();
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("records 5000 "), "{}", out.stdout);
    assert!(!out.stderr.contains("permission denied"), "{}", out.stderr);
    let observed = observe(&**owner).await.unwrap();
    assert_eq!(differences(&observed, &expected), Vec::<String>::new());

    // Parked by a constraint of the owner's, then re-driven by the role once it is gone.
    owner
        .batch_execute("ALTER TABLE balances ADD CONSTRAINT not_yet CHECK (account_id <> 1000007)")
        .await
        .unwrap();
    let parked = broker.topic("role-parked");
    batch_inbox_tools::produce::ensure_topic(&broker.addr, &parked, 1)
        .await
        .unwrap();
    let mut raw = common::raw_producer::RawProducer::new(&broker.addr, &parked);
    for (n, amount) in [(1, 10), (2, 20), (3, 12)] {
        raw.send(&crate::redrive::entry(&uuid(9_000 + n), 1_000_007, amount));
    }
    raw.flush();
    let out = run(parked.clone()).await.unwrap();
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("records 3 new 3 "), "{}", out.stdout);
    owner
        .batch_execute("ALTER TABLE balances DROP CONSTRAINT not_yet")
        .await
        .unwrap();
    let out = binary(
        &[
            "dead-letters",
            "redrive",
            "--database-url",
            &app,
            "--topic",
            &parked,
        ],
        &[],
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout.trim(),
        "re-driven: applied 3 duplicate 0 rejected 0; still parked: failed again 0 failed \
         decoding again 0"
    );
    let out = binary(
        &[
            "dead-letters",
            "list",
            "--database-url",
            &app,
            "--topic",
            &parked,
            "--json",
        ],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout.lines().count(), 3, "{}", out.stdout);
    let balance: i64 = owner
        .query_one(
            "SELECT amount FROM balances WHERE account_id = 1000007",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(balance, 42);
    let marked: i64 = owner
        .query_one(
            "SELECT count(*) FROM dead_letters WHERE topic = $1 AND redrive_outcome = 'applied'",
            &[&parked],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(marked, 3);

    // Retention on the plain inbox: every row made older than the retention is removed.
    let rows: i64 = owner
        .query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows as u64, expected.new + 3);
    owner
        .batch_execute("UPDATE inbox SET processed_at = now() - interval '30 days'")
        .await
        .unwrap();
    let out = binary(
        &["cleanup", "--database-url", &app, "--retention", "7d"],
        &[],
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.starts_with(&format!("removed {rows} rows ")),
        "{}",
        out.stdout
    );
    let left: i64 = owner
        .query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_handlers_statement_on_a_table_the_role_may_not_write_fails_at_start() {
    let (url, pool) = fresh_core_db("startup_role_sql").await;
    let role = role_name("startup_role_sql_app");
    fresh_role(&role).await;
    let owner = pool.get().await.unwrap();
    owner
        .batch_execute(include_str!("../../../examples/sql/balances.ddl.sql"))
        .await
        .unwrap();
    // The core's grants, without the ledger's.
    let core = grants(&role);
    let core = core.split("-- run --handler ledger").next().unwrap();
    owner.batch_execute(core).await.unwrap();
    owner
        .batch_execute(&format!("GRANT SELECT ON balances TO {role}"))
        .await
        .unwrap();
    let sql = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/sql/balances_upsert.sql"
    );
    let out = binary(
        &[
            "run",
            "--database-url",
            &as_role(&url, &role),
            "--brokers",
            "127.0.0.1:1",
            "--handler",
            "sql",
            "--apply-sql",
            sql,
        ],
        &[],
    );
    assert_eq!(
        out.failure(),
        format!(
            "error: the database role \"{role}\" cannot run the SQL handler's statement, which \
             `run` needs: permission denied for table balances"
        )
    );
}

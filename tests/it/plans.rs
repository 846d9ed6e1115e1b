//! Every statement that looks rows up by key probes the table's primary key, whatever the
//! statistics say: on an empty table never analyzed, on a 100,000-row table analyzed when it
//! held 1,000, and on the same table analyzed again. The plan is the generic one
//! (`force_generic_plan`), the one a long-lived connection keeps once it has been made, so a
//! plan made while a table was small must not scan the table once it is large. The ledger's
//! statements run after its planner settings, as the ledger sends them
//! (`sql::ledger::PLANNER`); without them, their generic plans hash the table.

use crate::common::*;
use batch_inbox::internals::sql::{self, ledger};
use deadpool_postgres::Pool;

/// The tables a statement looks rows up in.
const TABLES: [&str; 4] = ["balances", "inbox", "consumer_offsets", "dead_letters"];

/// A statement, the values of its parameters for `EXECUTE`, and the planner settings it runs
/// under (`""`: none).
struct Case {
    name: &'static str,
    sql: &'static str,
    params: &'static str,
    settings: &'static str,
}

const fn case(
    name: &'static str,
    sql: &'static str,
    params: &'static str,
    settings: &'static str,
) -> Case {
    Case {
        name,
        sql,
        params,
        settings,
    }
}

const IDS: &str = "'{00000000-0000-0000-0000-000000000001}'";

fn cases() -> Vec<Case> {
    let pipeline = "";
    let ledger = ledger::PLANNER;
    vec![
        case(
            "inbox insert",
            sql::INSERT_IDS,
            "(IDS, 't', 0, '{1}')",
            pipeline,
        ),
        case(
            "inbox insert and offset",
            sql::INSERT_IDS_AND_OFFSET,
            "(IDS, 't', 0, '{1}', 'g', 2, NULL)",
            pipeline,
        ),
        case(
            "offset upsert",
            sql::UPSERT_OFFSET,
            "('g', 't', 0, 1, NULL)",
            pipeline,
        ),
        case(
            "offsets read",
            sql::READ_OFFSETS,
            "('g', 't', '{0,1}')",
            pipeline,
        ),
        case(
            "dead letters",
            sql::INSERT_DEAD_LETTERS,
            "('t', 0, '{1}', '{x}', '{}', '{r}', '{d}', '{}', '{}', '{}', '{1}')",
            pipeline,
        ),
        case(
            "ensure accounts",
            ledger::ENSURE_ACCOUNTS,
            "('{1,2}')",
            ledger,
        ),
        case("lock accounts", ledger::LOCK_ACCOUNTS, "('{1,2}')", ledger),
        case(
            "lock nowait",
            ledger::LOCK_ACCOUNTS_NOWAIT,
            "('{1,2}')",
            ledger,
        ),
        case(
            "guarded update",
            ledger::GUARDED_UPDATE,
            "('{1,2}', '{1,1}', '{0,0}', '{9,9}')",
            ledger,
        ),
        case(
            "write balances",
            ledger::WRITE_BALANCES,
            "('{1,2}', '{5,5}')",
            ledger,
        ),
        case("ensure one", ledger::ENSURE_ONE, "(1)", pipeline),
        case("apply one", ledger::APPLY_ONE, "(1, 5)", pipeline),
        case("read one", ledger::READ_ONE, "(1)", pipeline),
    ]
}

/// The generic plan of `case` on a new session.
async fn generic_plan(url: &str, case: &Case) -> String {
    let pool = batch_inbox::db::connect(url, 1).await.unwrap();
    let mut c = pool.get().await.unwrap();
    let tx = c.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    if !case.settings.is_empty() {
        tx.batch_execute(case.settings).await.unwrap();
    }
    tx.batch_execute(&format!("PREPARE s AS {}", case.sql))
        .await
        .unwrap();
    let params = case.params.replace("IDS", IDS);
    let plan: Vec<String> = tx
        .query(&format!("EXPLAIN EXECUTE s{params}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    plan.join("\n")
}

/// Whether `plan` probes keys only: no scan of a whole table, no hash or merge join.
fn problems(plan: &str) -> Vec<String> {
    let mut found: Vec<String> = TABLES
        .iter()
        .filter(|t| plan.contains(&format!("Seq Scan on {t}")))
        .map(|t| format!("Seq Scan on {t}"))
        .collect();
    for join in ["Hash", "Merge Join"] {
        if plan.contains(join) {
            found.push(join.to_owned());
        }
    }
    if !plan.contains("_pkey") {
        found.push("no primary-key probe".to_owned());
    }
    found
}

async fn exec(pool: &Pool, sql: &str) {
    pool.get().await.unwrap().batch_execute(sql).await.unwrap();
}

/// Fills every table with `from..=to` rows (accounts, ids, offsets of groups, dead letters).
async fn fill(pool: &Pool, from: i64, to: i64) {
    exec(
        pool,
        &format!(
            "INSERT INTO balances SELECT n, 100 FROM generate_series({from}, {to}) n;
             INSERT INTO inbox (message_id, topic, partition, \"offset\")
               SELECT md5(n::text)::uuid, 't', (n % 8)::int, n FROM generate_series({from}, {to}) n;
             INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, updated_at)
               SELECT 'g' || n, 't', 0, n, now() FROM generate_series({from}, {to}) n;
             INSERT INTO dead_letters (topic, partition, \"offset\", reason)
               SELECT 't', 0, n, 'invalid_payload' FROM generate_series({from}, {to}) n"
        ),
    )
    .await;
}

async fn check_all(url: &str, state: &str, failures: &mut Vec<String>) {
    for case in cases() {
        let plan = generic_plan(url, &case).await;
        let found = problems(&plan);
        if !found.is_empty() {
            failures.push(format!("{} ({state}): {found:?}\n{plan}", case.name));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_lookup_probes_the_index_whatever_the_statistics() {
    let (url, pool) = fresh_db("plans").await;
    let no_autovacuum: Vec<String> = TABLES
        .iter()
        .map(|t| format!("ALTER TABLE {t} SET (autovacuum_enabled = off)"))
        .collect();
    exec(&pool, &no_autovacuum.join(";")).await;
    let mut failures = Vec::new();

    check_all(&url, "empty, never analyzed", &mut failures).await;
    fill(&pool, 1, 1_000).await;
    exec(&pool, "ANALYZE").await;
    check_all(&url, "1,000 rows analyzed", &mut failures).await;
    fill(&pool, 1_001, 100_000).await;
    check_all(&url, "100,000 rows analyzed at 1,000", &mut failures).await;
    exec(&pool, "ANALYZE").await;
    check_all(&url, "100,000 rows analyzed", &mut failures).await;

    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

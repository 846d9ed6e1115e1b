//! A failure that is not the message's fault stalls the partition instead of dead-lettering its
//! messages: the operator renames the ledger's table away, or revokes the processor's grants,
//! while records wait; the binary (through Apache Kafka) commits, dead-letters and stores
//! nothing, says so on `/readyz` and in `batch_inbox_stalled`, and once the cause is fixed it
//! resumes by itself: the database then equals the model, with no dead letter beyond the
//! input's own bad records and overdrafts.

use crate::common;
use crate::common::broker::Broker;
use crate::common::child::Running;
use crate::common::group::OffsetReader;
use crate::common::http;
use std::time::Duration;

use batch_inbox_tools::generate::{generate, GeneratorSettings};
use batch_inbox_tools::verify::{differences, observe};
use common::*;
use deadpool_postgres::Pool;

/// A role without superuser rights for the processor, with the grants `migrate` would need.
const APP_ROLE: &str = "bi_stall_app";

async fn count(pool: &Pool, sql: &str) -> i64 {
    pool.get()
        .await
        .unwrap()
        .query_one(sql, &[])
        .await
        .unwrap()
        .get(0)
}

async fn exec(pool: &Pool, sql: &str) {
    pool.get().await.unwrap().batch_execute(sql).await.unwrap();
}

/// `batch_inbox_stall_retries_total{sqlstate="S"}` in a /metrics text.
fn stall_retries(metrics: &str, sqlstate: &str) -> u64 {
    let key = format!("batch_inbox_stall_retries_total{{sqlstate=\"{sqlstate}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits (at most 120 s) until `group` has committed every partition of `topic` to its end.
pub(crate) async fn wait_until_committed(
    broker: &Broker,
    group: &str,
    topic: &str,
    partitions: i32,
) {
    let offsets = OffsetReader::new(&broker.addr, group, topic, partitions);
    let ends = offsets.ends();
    http::poll(
        Duration::from_secs(120),
        "the group to commit the topic",
        || async { offsets.committed().is_some_and(|c| c == ends).then_some(()) },
    )
    .await;
}

/// An operator's mistake and its fix.
struct Case<'a> {
    name: &'a str,
    /// Run before the records arrive; `{db}` is the database's name.
    break_sql: &'a str,
    /// `break_sql` runs once the binary has started (its start-up checks passed), not before:
    /// a grant missing at start ends the process (exit 1), one revoked while it runs stalls.
    while_running: bool,
    /// Run once the binary has stalled on it three times.
    fix_sql: &'a str,
    /// What the stall reports.
    sqlstate: &'a str,
    /// The binary connects as [`APP_ROLE`] (not a superuser).
    as_app: bool,
    /// More flags of `run`.
    args: &'a [&'a str],
}

impl<'a> Case<'a> {
    fn new(name: &'a str, break_sql: &'a str, fix_sql: &'a str, sqlstate: &'a str) -> Self {
        Case {
            name,
            break_sql,
            fix_sql,
            sqlstate,
            while_running: false,
            as_app: false,
            args: &[],
        }
    }
}

/// Breaks the database with the case's `break_sql`, lets the binary stall on its `sqlstate`
/// for a few retries, fixes it with `fix_sql` and checks the outcome.
async fn stalls_then_resumes(case: Case<'_>) {
    let Case {
        name,
        sqlstate,
        as_app,
        ..
    } = case;
    let broker = Broker::start();
    let (url, pool) = fresh_db(name).await;
    let db = url.rsplit('/').next().unwrap().to_owned();
    let (break_sql, fix_sql) = (
        case.break_sql.replace("{db}", &db),
        case.fix_sql.replace("{db}", &db),
    );
    let topic = broker.topic(name);
    let group = Broker::group(&topic, "g");
    batch_inbox_tools::produce::ensure_topic(&broker.addr, &topic, 2)
        .await
        .unwrap();
    let (records, expected) = generate(GeneratorSettings {
        messages: 3_000,
        accounts: 50,
        duplicate_ratio: 0.1,
        bad_ratio: 0.01,
        seed: 19,
        ..GeneratorSettings::default()
    });
    let run_url = if as_app {
        exec(
            &pool,
            &format!(
                "DO $$ BEGIN CREATE ROLE {APP_ROLE} LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
                 GRANT ALL ON ALL TABLES IN SCHEMA public TO {APP_ROLE};
                 GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {APP_ROLE};
                 GRANT ALL ON SCHEMA public TO {APP_ROLE}"
            ),
        )
        .await;
        url.replacen("postgres@", &format!("{APP_ROLE}@"), 1)
    } else {
        url.clone()
    };
    let producer = batch_inbox_tools::produce::producer(&broker.addr, &[]).unwrap();
    if !case.while_running {
        exec(&pool, &break_sql).await;
        batch_inbox_tools::produce::send_all(&producer, &topic, records.clone())
            .await
            .unwrap();
    }

    let mut args = vec![
        "run",
        "--topic",
        &topic,
        "--group",
        &group,
        "--metrics-addr",
        "127.0.0.1:0",
        "--log-interval",
        "0",
    ];
    args.extend(case.args);
    let env = [
        ("DATABASE_URL", run_url.as_str()),
        ("KAFKA_BROKERS", broker.addr.as_str()),
        ("RUST_LOG", "info,rdkafka=warn"),
    ];
    let mut run = Running::spawn(&args, &env);
    let addr = run.metrics_addr().await;
    if case.while_running {
        exec(&pool, &break_sql).await;
        batch_inbox_tools::produce::send_all(&producer, &topic, records)
            .await
            .unwrap();
    }
    let body = http::poll(
        Duration::from_secs(90),
        "/readyz to say stalled",
        || async {
            let (status, body) = http::get(addr, "/readyz").await;
            (status == 503 && body.contains("stalled")).then_some(body)
        },
    )
    .await;
    assert!(body.contains(&format!("SQLSTATE {sqlstate}")), "{body}");
    http::poll(Duration::from_secs(90), "three stalled retries", || async {
        let (_, metrics) = http::get(addr, "/metrics").await;
        (stall_retries(&metrics, sqlstate) >= 3).then_some(())
    })
    .await;
    // Stalled: nothing committed, nothing dead-lettered.
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM dead_letters").await, 0);
    // Each case waits on the database, not on the breaker or Kafka: the alert that fires is
    // the one whose remedy is the schema, a grant or a setting.
    let (_, metrics) = http::get(addr, "/metrics").await;
    let stalled: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("batch_inbox_stalled{") && l.ends_with(" 1"))
        .collect();
    assert!(!stalled.is_empty(), "{metrics}");
    assert!(
        stalled
            .iter()
            .all(|l| l.ends_with(",reason=\"database\"} 1")),
        "{metrics}"
    );

    exec(&pool, &fix_sql).await;
    wait_until_committed(&broker, &group, &topic, 2).await;
    let (status, body) = http::get(addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let (_, metrics) = http::get(addr, "/metrics").await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("batch_inbox_stalled{") && l.ends_with(" 1")),
        "{metrics}"
    );
    let finished = run.stop().await;
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
    assert!(
        finished
            .stderr
            .contains("partition stalled, not the message's fault"),
        "{}",
        finished.stderr
    );
    // The database's error once, by its message: no driver's `db error` chain.
    assert!(!finished.stderr.contains("db error"), "{}", finished.stderr);
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, &expected), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_renamed_away_stalls_and_resumes_without_a_dead_letter() {
    stalls_then_resumes(Case::new(
        "stall_rename",
        "ALTER TABLE balances RENAME TO balances_away",
        "ALTER TABLE balances_away RENAME TO balances",
        "42P01",
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_grant_stalls_and_resumes_without_a_dead_letter() {
    let (revoke, grant) = (
        format!("REVOKE INSERT, UPDATE ON balances FROM {APP_ROLE}"),
        format!("GRANT INSERT, UPDATE ON balances TO {APP_ROLE}"),
    );
    stalls_then_resumes(Case {
        as_app: true,
        while_running: true,
        ..Case::new("stall_revoke", &revoke, &grant, "42501")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_column_stalls_and_resumes_once_it_is_back() {
    stalls_then_resumes(Case::new(
        "stall_column",
        "ALTER TABLE balances DROP COLUMN amount",
        "ALTER TABLE balances ADD COLUMN amount bigint NOT NULL DEFAULT 0",
        "42703",
    ))
    .await;
}

/// The database's `default_transaction_read_only` applies to new sessions only: the stall
/// must open new ones to see it switched off again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_stalls_and_resumes_once_it_is_writable() {
    stalls_then_resumes(Case::new(
        "stall_read_only",
        "ALTER DATABASE {db} SET default_transaction_read_only = on",
        "ALTER DATABASE {db} RESET default_transaction_read_only",
        "25006",
    ))
    .await;
}

/// Every write to `balances` takes 2 s against a 1 s statement timeout: batches time out, are
/// bisected after three timeouts each, and the single message that still times out stalls the
/// partition (57014), with nothing dead-lettered, until the slow trigger is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_that_time_out_stall_the_partition_instead_of_dead_lettering() {
    stalls_then_resumes(Case {
        args: &["--statement-timeout", "1s", "--batch-size", "16"],
        ..Case::new(
            "stall_timeout",
            "CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql
               AS $$ BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$;
             CREATE TRIGGER slow_write BEFORE INSERT OR UPDATE ON balances
               FOR EACH ROW EXECUTE FUNCTION slow_write()",
            "DROP TRIGGER slow_write ON balances",
            "57014",
        )
    })
    .await;
}

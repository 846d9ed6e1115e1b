//! A database migrated by a release before migrations had owners (one version sequence for every
//! table, versions 1 to 8) upgrades in place: re-recorded under the owners, nothing lost. The
//! old schema is built here from today's SQL files and the rows those releases wrote, without
//! their code.

use std::time::{Duration, SystemTime};

use super::{binary, latest, migrate_at_once, recorded, relations, versions, Recorded};
use crate::common::empty_db;
use batch_inbox::{db, ledger, DbError};
use deadpool_postgres::Pool;

/// `schema_migrations` as the releases before owners created it.
const TABLE_BEFORE_OWNERS: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now())";

/// The migrations of the releases before owners, in their order then: version, name, SQL.
const BEFORE_OWNERS: [(i32, &str, &str); 8] = [
    (
        1,
        "inbox",
        include_str!("../../../migrations/core/0001_inbox.sql"),
    ),
    (
        2,
        "balances",
        include_str!("../../../migrations/ledger/0001_balances.sql"),
    ),
    (
        3,
        "balances_fillfactor",
        include_str!("../../../migrations/ledger/0002_balances_fillfactor.sql"),
    ),
    (
        4,
        "consumer_offsets",
        include_str!("../../../migrations/core/0002_consumer_offsets.sql"),
    ),
    (
        5,
        "inbox_processed_at",
        include_str!("../../../migrations/core/0003_inbox_processed_at.sql"),
    ),
    (
        6,
        "dead_letters_raw_id",
        include_str!("../../../migrations/core/0004_dead_letters_raw_id.sql"),
    ),
    (
        7,
        "inbox_processed_at_not_v7",
        include_str!("../../../migrations/core/0005_inbox_processed_at_not_v7.sql"),
    ),
    (
        8,
        "dead_letters_redrive",
        include_str!("../../../migrations/core/0006_dead_letters_redrive.sql"),
    ),
];

/// When version `v` was applied in the fixture: day `v` of 2025, so that a kept `applied_at`
/// tells which row it came from.
fn applied_at(v: i32) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_735_689_600 + 86_400 * (v as u64 - 1))
}

/// Builds the schema a release before owners left after applying versions `1..=upto`, each in
/// its transaction with its row, as that release's migrate did.
async fn schema_before_owners(pool: &Pool, upto: i32) {
    let mut c = pool.get().await.unwrap();
    c.batch_execute(TABLE_BEFORE_OWNERS).await.unwrap();
    for (version, name, sql) in BEFORE_OWNERS.iter().filter(|m| m.0 <= upto) {
        let tx = c.transaction().await.unwrap();
        tx.batch_execute(sql).await.unwrap();
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
            &[version, name, &applied_at(*version)],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
}

/// Rows in every table of the full schema before owners.
async fn fill(pool: &Pool) {
    pool.get()
        .await
        .unwrap()
        .batch_execute(
            "INSERT INTO inbox (message_id, topic, partition, \"offset\")
                 SELECT md5(n::text)::uuid, 'ledger', n % 4, n / 4 FROM generate_series(1, 1000) n;
             INSERT INTO balances SELECT n, n * 100 FROM generate_series(1, 100) n;
             INSERT INTO dead_letters (topic, partition, \"offset\", message_id, reason, payload)
                 SELECT 'ledger', 0, n, NULL, 'invalid_payload', 'x' FROM generate_series(1, 3) n;
             INSERT INTO consumer_offsets (group_id, topic, partition, next_offset)
                 VALUES ('g', 'ledger', 0, 250), ('g', 'ledger', 1, 250);",
        )
        .await
        .unwrap();
}

/// Each table's row count and a digest of its rows, in key order.
async fn contents(pool: &Pool) -> Vec<(String, i64, String)> {
    let c = pool.get().await.unwrap();
    let mut out = Vec::new();
    for (table, key) in [
        ("inbox", "message_id"),
        ("balances", "account_id"),
        ("dead_letters", "topic, partition, \"offset\""),
        ("consumer_offsets", "group_id, topic, partition"),
    ] {
        let row = c
            .query_one(
                &format!(
                    "SELECT count(*), coalesce(md5(string_agg(t::text, ',' ORDER BY {key})), '')
                     FROM {table} t"
                ),
                &[],
            )
            .await
            .unwrap();
        out.push((table.to_owned(), row.get(0), row.get(1)));
    }
    out
}

/// What the re-recording makes of rows `1..=upto` before owners: (owner, version, name,
/// applied_at), by owner and version.
/// `rows` without the core's migrations after the last release before owners (core 7 on).
fn without_later(rows: Vec<Recorded>) -> Vec<Recorded> {
    rows.into_iter()
        .filter(|r| !(r.0 == "core" && r.1 > 6))
        .collect()
}

fn rerecorded(upto: i32) -> Vec<Recorded> {
    let now = [
        ("core", 1),
        ("ledger", 1),
        ("ledger", 2),
        ("core", 2),
        ("core", 3),
        ("core", 4),
        ("core", 5),
        ("core", 6),
    ];
    let mut rows: Vec<Recorded> = BEFORE_OWNERS
        .iter()
        .zip(now)
        .filter(|((v, _, _), _)| *v <= upto)
        .map(|((v, name, _), (owner, version))| {
            (owner.to_owned(), version, name.to_string(), applied_at(*v))
        })
        .collect();
    rows.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    rows
}

/// Today's database, full and holding data, upgraded by the binary's default `migrate`: every
/// row re-recorded under its owner with its `applied_at`, nothing applied again, every table's
/// rows and the balances' storage option unchanged, and both schema checks pass.
#[tokio::test]
async fn a_database_of_the_releases_before_owners_upgrades_in_place_keeping_its_data() {
    let (url, pool) = empty_db("mig_before_owners").await;
    schema_before_owners(&pool, 8).await;
    fill(&pool).await;
    let (data, rels) = (contents(&pool).await, relations(&pool).await);
    assert_eq!(
        [data[0].1, data[1].1, data[2].1, data[3].1],
        [1000, 100, 3, 2]
    );
    let err = db::check_schema(&pool).await.unwrap_err();
    assert!(matches!(err, DbError::LegacySchema { .. }), "{err}");

    let out = binary(&["migrate", "--database-url", &url], &[]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout, "core migrations applied: [7, 8]\nledger migrations applied: []",
        "re-recorded, then only what came after that release"
    );
    assert_eq!(without_later(recorded(&pool).await), rerecorded(8));
    assert_eq!(
        versions(&recorded(&pool).await),
        latest(&[db::CORE, ledger::OWNER])
    );
    assert_eq!(contents(&pool).await, data, "every row kept");
    let schema_table = |r: &(String, String, Option<Vec<String>>)| {
        r.0.starts_with("schema_")
            || r.0.starts_with("consumer_topics")
            || r.0.starts_with("consumer_offset_changes")
    };
    let same: Vec<_> = rels.iter().filter(|r| !schema_table(r)).collect();
    let now = relations(&pool).await;
    assert_eq!(
        now.iter().filter(|r| !schema_table(r)).collect::<Vec<_>>(),
        same
    );
    let balances = now.iter().find(|r| r.0 == "balances").unwrap();
    assert_eq!(balances.2, Some(vec!["fillfactor=70".to_owned()]));
    db::check_schema(&pool).await.unwrap();
    ledger::check_schema(&pool).await.unwrap();
}

/// A database before owners that stopped at version 3 (inbox, balances, its fillfactor),
/// upgraded by the core's migrate alone, as a SQL handler's operator would: re-recorded, then
/// the core's missing migrations applied; the ledger's are already recorded.
#[tokio::test]
async fn a_partly_migrated_database_before_owners_is_re_recorded_then_brought_up() {
    let (_url, pool) = empty_db("mig_before_owners_part").await;
    schema_before_owners(&pool, 3).await;
    assert_eq!(db::migrate(&pool).await.unwrap(), [2, 3, 4, 5, 6, 7, 8]);
    let rows = recorded(&pool).await;
    assert_eq!(
        versions(&rows),
        latest(&[db::CORE, ledger::OWNER]),
        "core 1 and ledger 1-2 re-recorded, core 2-7 applied"
    );
    let kept: Vec<Recorded> = rows
        .into_iter()
        .filter(|r| r.0 == "ledger" || r.1 == 1)
        .collect();
    assert_eq!(
        kept,
        rerecorded(3),
        "the re-recorded rows keep their applied_at"
    );
    assert_eq!(ledger::migrate(&pool).await.unwrap(), Vec::<i32>::new());
}

/// A `schema_migrations` before owners with a row that no release recorded is not guessed at:
/// the migrate fails and the table stays as it was.
#[tokio::test]
async fn a_row_no_release_recorded_stops_the_upgrade_and_changes_nothing() {
    let (_url, pool) = empty_db("mig_before_owners_unknown").await;
    schema_before_owners(&pool, 8).await;
    let c = pool.get().await.unwrap();
    c.execute(
        "INSERT INTO schema_migrations (version, name) VALUES (9, 'hand_made')",
        &[],
    )
    .await
    .unwrap();
    let err = ledger::migrate(&pool).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "database schema: schema_migrations records version 9 (\"hand_made\"), which no release \
         recorded: nothing was changed"
    );
    let rows = c
        .query("SELECT version FROM schema_migrations ORDER BY 1", &[])
        .await
        .unwrap();
    let left: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        left,
        (1..=9).collect::<Vec<_>>(),
        "still the layout before owners"
    );
}

/// Eight migrates of both owners at once on a database before owners: it is re-recorded once,
/// and none of them fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrates_re_record_a_database_before_owners_once() {
    let (_url, pool) = empty_db("mig_before_owners_concurrent").await;
    schema_before_owners(&pool, 8).await;
    let mut results = migrate_at_once(&pool).await;
    results.sort();
    let once: Vec<Vec<i32>> = std::iter::repeat_n(vec![], results.len() - 1)
        .chain([vec![7, 8]])
        .collect();
    assert_eq!(results, once, "re-recorded once, core 7 and 8 applied once");
    assert_eq!(without_later(recorded(&pool).await), rerecorded(8));
}

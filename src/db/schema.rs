//! The migration runner shared by every owner of tables (the core, the ledger): each owner's
//! versions recorded apart in `schema_migrations`, the layout of releases before owners
//! re-recorded in place.
//!
//! Invariant: an owner's migrations, and the re-recording of an unowned `schema_migrations`,
//! run in one transaction that holds the migration lock from its first statement, so two
//! migrates (of the same owner or of two) never interleave, and a failure leaves the database
//! as it was.

use deadpool_postgres::{GenericClient, Pool};

use super::error::DbError;
use super::Migration;

/// Arbitrary constant identifying the migration lock among advisory locks (the same as in
/// releases before owners, so that an older `migrate` waits for a newer one too).
const MIGRATION_LOCK: i64 = 0x6261_7463_6869_6e62;

/// The versions table, keyed by owner and version.
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    owner      text        NOT NULL,
    version    int         NOT NULL,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, version))";

/// Every row that releases before owners recorded, one sequence for every table: (version
/// then, name, owner, version now). Names did not change. The ledger's owner is spelled out
/// (`"ledger"`, the ledger's `OWNER`), so that the core does not depend on the ledger; a unit
/// test checks each row against the owners' migration lists.
pub(crate) const BEFORE_OWNERS: [(i32, &str, &str, i32); 8] = [
    (1, "inbox", super::CORE, 1),
    (2, "balances", "ledger", 1),
    (3, "balances_fillfactor", "ledger", 2),
    (4, "consumer_offsets", super::CORE, 2),
    (5, "inbox_processed_at", super::CORE, 3),
    (6, "dead_letters_raw_id", super::CORE, 4),
    (7, "inbox_processed_at_not_v7", super::CORE, 5),
    (8, "dead_letters_redrive", super::CORE, 6),
];

/// How `schema_migrations` is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// No such table: nothing was ever migrated.
    Missing,
    /// One sequence for every table (releases before owners): no `owner` column.
    Unowned,
    /// Versions by owner.
    Owned,
}

async fn layout(client: &impl GenericClient) -> Result<Layout, DbError> {
    let row = client
        .query_one(
            "SELECT to_regclass('schema_migrations') IS NOT NULL,
                    EXISTS (SELECT FROM pg_attribute
                            WHERE attrelid = to_regclass('schema_migrations')
                              AND attname = 'owner' AND NOT attisdropped)",
            &[],
        )
        .await?;
    Ok(match (row.get(0), row.get(1)) {
        (false, _) => Layout::Missing,
        (true, false) => Layout::Unowned,
        (true, true) => Layout::Owned,
    })
}

/// Applies `owner`'s `migrations` not yet applied; returns the versions applied now.
pub(crate) async fn migrate(
    pool: &Pool,
    owner: &str,
    migrations: &[Migration],
) -> Result<Vec<i32>, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    match layout(&tx).await? {
        Layout::Missing => tx.batch_execute(CREATE_TABLE).await?,
        Layout::Unowned => rerecord_by_owner(&tx).await?,
        Layout::Owned => {}
    }
    let done: Vec<i32> = tx
        .query(
            "SELECT version FROM schema_migrations WHERE owner = $1",
            &[&owner],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut applied = Vec::new();
    for m in migrations.iter().filter(|m| !done.contains(&m.version)) {
        tx.batch_execute(m.sql).await?;
        tx.execute(
            "INSERT INTO schema_migrations (owner, version, name) VALUES ($1, $2, $3)",
            &[&owner, &m.version, &m.name],
        )
        .await?;
        applied.push(m.version);
    }
    tx.commit().await?;
    Ok(applied)
}

/// Replaces an unowned `schema_migrations` with the owned layout, each row under its owner and
/// its version there ([`BEFORE_OWNERS`]), `applied_at` kept. Every row is checked before
/// anything changes.
async fn rerecord_by_owner(tx: &deadpool_postgres::Transaction<'_>) -> Result<(), DbError> {
    let rows = tx
        .query(
            "SELECT version, name, applied_at FROM schema_migrations ORDER BY version",
            &[],
        )
        .await?;
    let mut owned = Vec::with_capacity(rows.len());
    for row in &rows {
        let (was, name): (i32, String) = (row.get(0), row.get(1));
        let applied_at: std::time::SystemTime = row.get(2);
        match BEFORE_OWNERS
            .iter()
            .find(|(v, n, _, _)| *v == was && *n == name)
        {
            Some(&(_, _, owner, version)) => owned.push((owner, version, name, applied_at)),
            None => return Err(DbError::UnknownMigration { version: was, name }),
        }
    }
    tx.batch_execute("DROP TABLE schema_migrations").await?;
    tx.batch_execute(CREATE_TABLE).await?;
    for (owner, version, name, applied_at) in &owned {
        tx.execute(
            "INSERT INTO schema_migrations (owner, version, name, applied_at)
             VALUES ($1, $2, $3, $4)",
            &[owner, version, name, applied_at],
        )
        .await?;
    }
    tracing::info!(
        rows = owned.len(),
        "schema_migrations re-recorded by owner (a release before owners recorded it)"
    );
    Ok(())
}

/// Fails unless every one of `owner`'s `migrations` has been applied; the error tells to run
/// `migrate_command`.
pub(crate) async fn check(
    pool: &Pool,
    owner: &'static str,
    migrations: &[Migration],
    migrate_command: &'static str,
) -> Result<(), DbError> {
    let client = pool.get().await?;
    let want = migrations.last().map_or(0, |m| m.version);
    let have: i32 = match layout(&client).await? {
        Layout::Missing => 0,
        Layout::Unowned => {
            return Err(DbError::LegacySchema {
                migrate: migrate_command,
            })
        }
        Layout::Owned => client
            .query_one(
                "SELECT coalesce(max(version), 0) FROM schema_migrations WHERE owner = $1",
                &[&owner],
            )
            .await?
            .get(0),
    };
    if have < want {
        return Err(DbError::Schema {
            owner,
            have,
            want,
            migrate: migrate_command,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row of the releases before owners names the migration that now has its owner and
    /// version, once.
    #[test]
    fn the_rows_before_owners_map_onto_the_owners_migrations() {
        let lists = [
            (super::super::CORE, super::super::MIGRATIONS),
            (
                crate::handlers::ledger::OWNER,
                crate::handlers::ledger::MIGRATIONS,
            ),
        ];
        for (was, name, owner, version) in BEFORE_OWNERS {
            let (_, list) = lists.iter().find(|(o, _)| *o == owner).expect("an owner");
            let m = list
                .iter()
                .find(|m| m.version == version)
                .expect("a version");
            assert_eq!(m.name, name, "version {was} before owners");
        }
        let mut now: Vec<(&str, i32)> = BEFORE_OWNERS.iter().map(|r| (r.2, r.3)).collect();
        now.sort();
        now.dedup();
        assert_eq!(
            now.len(),
            BEFORE_OWNERS.len(),
            "one row per owner and version"
        );
        let versions: Vec<i32> = BEFORE_OWNERS.iter().map(|r| r.0).collect();
        assert_eq!(versions, (1..=8).collect::<Vec<_>>());
    }

    #[test]
    fn each_owners_versions_count_from_one() {
        for list in [
            super::super::MIGRATIONS,
            crate::handlers::ledger::MIGRATIONS,
        ] {
            let versions: Vec<i32> = list.iter().map(|m| m.version).collect();
            assert_eq!(versions, (1..=list.len() as i32).collect::<Vec<_>>());
        }
    }
}

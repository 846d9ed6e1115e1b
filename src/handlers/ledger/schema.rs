//! The ledger's tables (`balances`), versioned apart from the core's: a database that only the
//! SQL handler applies to never gets them (module `db`, versions by owner).

use deadpool_postgres::Pool;

use crate::db::DbError;
use crate::db::Migration;

/// The owner name under which the ledger's migrations are recorded in `schema_migrations`.
pub const OWNER: &str = "ledger";

/// The ledger's migrations, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "balances",
        sql: include_str!("../../../migrations/ledger/0001_balances.sql"),
    },
    Migration {
        version: 2,
        name: "balances_fillfactor",
        sql: include_str!("../../../migrations/ledger/0002_balances_fillfactor.sql"),
    },
];

/// What a ledger schema behind tells an operator to run.
const MIGRATE: &str = "`batch-inbox migrate --handler ledger`";

/// Creates or upgrades the ledger's tables (`balances`): applies the ledger's [`MIGRATIONS`]
/// not yet applied, in one transaction under the migration lock, and returns the versions
/// applied now. The ledger also needs the core's tables: run [`crate::db::migrate`] too (the
/// order does not matter). Like it, re-records a `schema_migrations` of a release before
/// owners first.
pub async fn migrate(pool: &Pool) -> Result<Vec<i32>, DbError> {
    crate::db::schema::migrate(pool, OWNER, MIGRATIONS).await
}

/// Fails with [`DbError::Schema`] unless every ledger migration has been applied (the core's
/// are [`crate::db::check_schema`]'s).
pub async fn check_schema(pool: &Pool) -> Result<(), DbError> {
    crate::db::schema::check(pool, OWNER, MIGRATIONS, MIGRATE).await
}

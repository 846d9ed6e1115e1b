//! The database's error: setting it up (the pool, TLS, migrations) and the checks at start
//! (grants, the schema's version).

use deadpool_postgres::PoolError;

use crate::fault::is_retryable_db;
use crate::one_line::{pg_line, pool_line};

/// Failure to set up the database (pool, migrations).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The database URL does not parse.
    #[error("invalid database URL: {0}")]
    Url(String),
    /// The pool could not be built.
    #[error("cannot build the connection pool: {0}")]
    Build(String),
    /// TLS to the database could not be set up (`sslmode=require`, `PGSSLROOTCERT`).
    #[error("cannot set up TLS to the database: {0}")]
    Tls(String),
    /// A connection could not be had.
    #[error("cannot connect to the database: {}", pool_line(.0))]
    Pool(#[from] PoolError),
    /// A statement failed.
    #[error("database: {}", pg_line(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// The first connection failed: the database's address (hosts and ports, never the URL's
    /// password) and the reason, once.
    #[error("cannot connect to the database at {at}: {}", connect_line(.error))]
    Connect {
        /// `host:port` (several, comma-separated, when the URL names several; a socket
        /// directory for a Unix socket).
        at: String,
        /// The pool's failure (said by the message, so not its source).
        error: PoolError,
    },
    /// The role lacks a privilege a command needs (found at start, by running the command's
    /// statements on empty input in a transaction that is rolled back).
    #[error(
        "the database role {role:?} lacks {privilege} on table {table}, which `{command}` needs: \
         GRANT {privilege} ON {table} TO {role:?} (docs/OPERATIONS.md, \"Database roles and \
         grants\")"
    )]
    Grant {
        /// The role (`current_user`).
        role: String,
        /// The table.
        table: String,
        /// The privilege (`SELECT`, `INSERT`, `UPDATE`, `DELETE`).
        privilege: String,
        /// The command that needs it (`run`, `dead-letters redrive`, …).
        command: String,
    },
    /// The role may not run a statement a command needs, for a reason that is not one table's
    /// privilege (the SQL handler's statement, a schema's `USAGE`, a table's owner): the
    /// server's message.
    #[error("the database role {role:?} cannot run {what}, which `{command}` needs: {message}")]
    Denied {
        /// The role (`current_user`).
        role: String,
        /// What it cannot run (`the --apply-sql statement`, `the inbox's partition upkeep`).
        what: String,
        /// The command that needs it.
        command: String,
        /// The server's message (`permission denied for table accounts`).
        message: String,
    },
    /// An owner's tables are older than this binary.
    #[error(
        "database schema: the {owner}'s tables are at version {have}, this binary needs {want}: \
         run {migrate}"
    )]
    Schema {
        /// Whose tables: `core` or `ledger`.
        owner: &'static str,
        /// The owner's latest applied migration (0: none).
        have: i32,
        /// The owner's latest known migration.
        want: i32,
        /// The command that brings them up, quoted.
        migrate: &'static str,
    },
    /// `schema_migrations` still has the layout of a release before migrations had owners.
    #[error(
        "database schema: schema_migrations was recorded by a release before versions by owner: \
         run {migrate} to re-record it"
    )]
    LegacySchema {
        /// The command that re-records it, quoted.
        migrate: &'static str,
    },
    /// `schema_migrations` (in the layout before owners) holds a row that no release recorded:
    /// it is not re-recorded, and nothing is changed.
    #[error(
        "database schema: schema_migrations records version {version} ({name:?}), which no \
         release recorded: nothing was changed"
    )]
    UnknownMigration {
        /// Its version.
        version: i32,
        /// Its name.
        name: String,
    },
}

impl DbError {
    /// Whether trying again soon may succeed: the server is not up yet or not reachable (refused,
    /// timed out, starting up, too many connections). A refused password, a missing database
    /// or grant, or a schema behind are not.
    pub fn is_transient(&self) -> bool {
        match self {
            DbError::Pool(e) | DbError::Connect { error: e, .. } => match e {
                PoolError::Backend(pg) => is_retryable_db(pg),
                PoolError::Timeout(_) => true,
                _ => false,
            },
            DbError::Postgres(pg) => is_retryable_db(pg),
            _ => false,
        }
    }

    /// This error with `migrate` (quoted) as the command that fixes it, when it is a schema
    /// behind; any other error unchanged. A caller that knows the handler names its `migrate`.
    pub fn with_migrate(self, migrate: &'static str) -> Self {
        match self {
            DbError::Schema {
                owner, have, want, ..
            } => DbError::Schema {
                owner,
                have,
                want,
                migrate,
            },
            DbError::LegacySchema { .. } => DbError::LegacySchema { migrate },
            other => other,
        }
    }
}

/// Why connecting failed, without the driver's `error connecting to server` (the caller says
/// that): the operating system's reason (`Connection refused (os error 111)`), or the server's
/// (`password authentication failed for user "app"`).
fn connect_line(e: &PoolError) -> String {
    if let PoolError::Timeout(_) = e {
        return "no answer (timed out)".to_owned();
    }
    if let PoolError::Backend(pg) = e {
        if pg.as_db_error().is_none() {
            if let Some(io) =
                std::error::Error::source(pg).and_then(|s| s.downcast_ref::<std::io::Error>())
            {
                return io.to_string();
            }
        }
    }
    pool_line(e)
}

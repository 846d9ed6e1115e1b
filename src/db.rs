//! Connection pool and schema migrations.
//!
//! Migrations are the numbered files of `migrations/`, compiled into the binary, applied in order
//! inside one transaction under an advisory lock and recorded in `schema_migrations`, so running
//! `migrate` twice, or from two processes at once, is safe.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, ManagerConfig, Pool, RecyclingMethod, Runtime};

use crate::error::DbError;

/// The transaction a batch runs in, and that a [`Handler`](crate::Handler) works in: the pool's
/// (deadpool-postgres) transaction, so that a handler can use every `tokio_postgres` call on it.
pub use deadpool_postgres::Transaction;

/// One schema migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Version number, strictly increasing.
    pub version: i32,
    /// Short name.
    pub name: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

/// Every migration, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "inbox",
        sql: include_str!("../migrations/0001_inbox.sql"),
    },
    Migration {
        version: 2,
        name: "balances",
        sql: include_str!("../migrations/0002_balances.sql"),
    },
    Migration {
        version: 3,
        name: "balances_fillfactor",
        sql: include_str!("../migrations/0003_balances_fillfactor.sql"),
    },
    Migration {
        version: 4,
        name: "consumer_offsets",
        sql: include_str!("../migrations/0004_consumer_offsets.sql"),
    },
    Migration {
        version: 5,
        name: "inbox_processed_at",
        sql: include_str!("../migrations/0005_inbox_processed_at.sql"),
    },
    Migration {
        version: 6,
        name: "dead_letters_raw_id",
        sql: include_str!("../migrations/0006_dead_letters_raw_id.sql"),
    },
    Migration {
        version: 7,
        name: "inbox_processed_at_not_v7",
        sql: include_str!("../migrations/0007_inbox_processed_at_not_v7.sql"),
    },
    Migration {
        version: 8,
        name: "dead_letters_redrive",
        sql: include_str!("../migrations/0008_dead_letters_redrive.sql"),
    },
];

/// Arbitrary constant identifying the migration lock among advisory locks.
const MIGRATION_LOCK: i64 = 0x6261_7463_6869_6e62;

/// How the pool's connections are opened, besides what the URL says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    /// `statement_timeout` (and `idle_in_transaction_session_timeout`) set on each connection
    /// when it is opened, one `SET` per connection, none per transaction; `None` leaves the
    /// server's (or the URL's `options`) in place.
    pub statement_timeout: Option<Duration>,
}

/// How long a connection attempt may take (unless the URL says `connect_timeout`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle time before the first TCP keepalive probe, the time between probes, and how many
/// unanswered probes drop the connection: a dead peer of an idle connection is found in 60 s.
pub const KEEPALIVE: (Duration, Duration, u32) =
    (Duration::from_secs(30), Duration::from_secs(10), 3);
/// How long sent data may stay unacknowledged before the kernel drops the connection
/// (`TCP_USER_TIMEOUT`; keepalives do not fire while data waits for its acknowledgement).
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds a pool of at most `size` connections to `url`. Connects once to fail early.
pub async fn connect(url: &str, size: usize) -> Result<Pool, DbError> {
    connect_with(url, size, ConnectOptions::default()).await
}

/// [`connect`] with `options`. Every connection gets TCP keepalives ([`KEEPALIVE`]), a
/// [`TCP_USER_TIMEOUT`] and a [`CONNECT_TIMEOUT`], unless the URL sets its own.
pub async fn connect_with(
    url: &str,
    size: usize,
    options: ConnectOptions,
) -> Result<Pool, DbError> {
    let mut config = tokio_postgres::Config::from_str(url).map_err(|e| url_error(&e))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("batch-inbox");
    }
    set_tcp_timeouts(&mut config);
    let manager = crate::db_tls::manager(
        config,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    )?;
    let mut builder = Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(10)));
    if let Some(timeout) = options.statement_timeout.filter(|t| !t.is_zero()) {
        let set = format!(
            "SET statement_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}",
            ms = timeout.as_millis()
        );
        builder = builder.post_create(Hook::async_fn(move |client, _| {
            let set = set.clone();
            Box::pin(async move { client.batch_execute(&set).await.map_err(HookError::Backend) })
        }));
    }
    let pool = builder.build().map_err(|e| DbError::Build(e.to_string()))?;
    drop(pool.get().await?);
    Ok(pool)
}

/// Keepalives and `TCP_USER_TIMEOUT`, where the URL does not set them (libpq's names:
/// `keepalives_idle`, `keepalives_interval`, `keepalives_retries`, `tcp_user_timeout`; an idle
/// time of two hours is the driver's default, taken for unset).
fn set_tcp_timeouts(config: &mut tokio_postgres::Config) {
    if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(KEEPALIVE.0);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE.1);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE.2);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
}

/// Why `url` does not parse: the driver's reason (`invalid value for option `port``), without the
/// character of the string the parser quotes (`expected `=` but got `x``), which can be one of
/// the password's.
fn url_error(e: &tokio_postgres::Error) -> DbError {
    let text = match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    };
    match text.find(" but got ") {
        Some(i) => DbError::Url(text[..i].to_owned()),
        None => DbError::Url(text),
    }
}

/// Applies the migrations not yet applied; returns the versions applied now.
pub async fn migrate(pool: &Pool) -> Result<Vec<i32>, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    int PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await?;
    let done: Vec<i32> = tx
        .query("SELECT version FROM schema_migrations", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| !done.contains(&m.version)) {
        tx.batch_execute(m.sql).await?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await?;
        applied.push(m.version);
    }
    tx.commit().await?;
    Ok(applied)
}

/// Fails with a clear error unless every migration has been applied.
pub async fn check_schema(pool: &Pool) -> Result<(), DbError> {
    let client = pool.get().await?;
    let latest = MIGRATIONS.last().map_or(0, |m| m.version);
    let row = client
        .query_one(
            "SELECT CASE WHEN to_regclass('schema_migrations') IS NULL THEN 0
                    ELSE (SELECT coalesce(max(version), 0) FROM schema_migrations) END",
            &[],
        )
        .await?;
    let have: i32 = row.get(0);
    if have < latest {
        return Err(DbError::Schema { have, want: latest });
    }
    Ok(())
}

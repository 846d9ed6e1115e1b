//! Connection pool and schema migrations.
//!
//! Migrations are numbered SQL files, compiled into the binary, applied in order inside one
//! transaction under an advisory lock and recorded in `schema_migrations`, so running `migrate`
//! twice, or from two processes at once, is safe.
//!
//! # Versions by owner
//!
//! Each set of tables has an owner, whose migrations are numbered from 1 and recorded under its
//! name (`schema_migrations (owner, version, name, applied_at)`), apart from every other owner's:
//! the core ([`CORE`], `migrations/core/`: `inbox`, `dead_letters`, `consumer_offsets`), which
//! every handler needs, and the ledger ([`crate::handlers::ledger::OWNER`], `migrations/ledger/`:
//! `balances`), which only the ledger needs. [`migrate`] and [`check_schema`] are the core's;
//! [`crate::handlers::ledger::migrate`] and [`crate::handlers::ledger::check_schema`] the ledger's. A database
//! applied to by the SQL handler holds the core's tables and none of the ledger's.
//!
//! Releases before owners recorded one sequence for every table (`schema_migrations (version,
//! name, applied_at)`, versions 1 to 8, the ledger's as 2 and 3). The first migrate of either
//! owner finds that layout by its missing `owner` column and re-records each row under its owner
//! and its version there (1 to 8 become core 1, ledger 1 and 2, core 2 to 6), keeping
//! `applied_at`, in the migration's transaction: the tables themselves are not touched. A row
//! that no release recorded stops it, with nothing changed.

pub(crate) mod sql;
pub(crate) mod tls;

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, ManagerConfig, Pool, RecyclingMethod, Runtime};

mod error;
mod grants;
pub(crate) mod schema;

pub use error::DbError;
pub(crate) use grants::check_statement;
pub use grants::{check_grants, Uses};

/// The transaction a batch runs in, and that a [`Handler`](crate::Handler) works in: the pool's
/// (deadpool-postgres) transaction, so that a handler can use every `tokio_postgres` call on it.
pub use deadpool_postgres::Transaction;

/// One schema migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Version number within its owner's migrations, from 1, strictly increasing.
    pub version: i32,
    /// Short name.
    pub name: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

/// The owner name under which the core's migrations are recorded in `schema_migrations`.
pub const CORE: &str = "core";

/// The core's migrations, in order: the tables of the pipeline itself (`inbox`,
/// `dead_letters`, `consumer_offsets`) and their later changes, whatever the handler.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "inbox",
        sql: include_str!("../migrations/core/0001_inbox.sql"),
    },
    Migration {
        version: 2,
        name: "consumer_offsets",
        sql: include_str!("../migrations/core/0002_consumer_offsets.sql"),
    },
    Migration {
        version: 3,
        name: "inbox_processed_at",
        sql: include_str!("../migrations/core/0003_inbox_processed_at.sql"),
    },
    Migration {
        version: 4,
        name: "dead_letters_raw_id",
        sql: include_str!("../migrations/core/0004_dead_letters_raw_id.sql"),
    },
    Migration {
        version: 5,
        name: "inbox_processed_at_not_v7",
        sql: include_str!("../migrations/core/0005_inbox_processed_at_not_v7.sql"),
    },
    Migration {
        version: 6,
        name: "dead_letters_redrive",
        sql: include_str!("../migrations/core/0006_dead_letters_redrive.sql"),
    },
    Migration {
        version: 7,
        name: "consumer_topics",
        sql: include_str!("../migrations/core/0007_consumer_topics.sql"),
    },
    Migration {
        version: 8,
        name: "consumer_offset_changes",
        sql: include_str!("../migrations/core/0008_consumer_offset_changes.sql"),
    },
];

/// What a core schema behind tells an operator to run (when it does not know the handler).
const CORE_MIGRATE: &str =
    "`batch-inbox migrate` (`batch-inbox migrate --handler sql` for the core's tables alone)";

/// How the pool's connections are opened, besides what the URL says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    /// `statement_timeout` (and `idle_in_transaction_session_timeout`) set on each connection
    /// when it is opened, one `SET` per connection, none per transaction; `None` leaves the
    /// server's (or the URL's `options`) in place.
    pub statement_timeout: Option<Duration>,
}

/// Connections this process's pools opened, counted as each is made. Pools reuse their
/// connections ([`RecyclingMethod::Fast`]), so after the first ones a change means a pool
/// reconnected: the server restarted, or a failover moved the session to another server, which
/// may hold an older state than the one this process wrote to. Partition workers compare their
/// positions with the database's when it changes (`worker::positions`).
static CONNECTIONS_OPENED: AtomicU64 = AtomicU64::new(0);

/// How many connections this process's pools have opened so far ([`CONNECTIONS_OPENED`]).
pub(crate) fn connections_opened() -> u64 {
    CONNECTIONS_OPENED.load(Ordering::Acquire)
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
    let at = address(&config);
    let manager = crate::db::tls::manager(
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
    let set = options
        .statement_timeout
        .filter(|t| !t.is_zero())
        .map(|timeout| {
            format!(
                "SET statement_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}",
                ms = timeout.as_millis()
            )
        });
    builder = builder.post_create(Hook::async_fn(move |client, _| {
        let set = set.clone();
        Box::pin(async move {
            if let Some(set) = set {
                client
                    .batch_execute(&set)
                    .await
                    .map_err(HookError::Backend)?;
            }
            CONNECTIONS_OPENED.fetch_add(1, Ordering::AcqRel);
            Ok(())
        })
    }));
    let pool = builder.build().map_err(|e| DbError::Build(e.to_string()))?;
    match pool.get().await {
        Ok(client) => drop(client),
        Err(error) => return Err(DbError::Connect { at, error }),
    }
    Ok(pool)
}

/// Where `config` connects: each host with its port (`127.0.0.1:5432`, a socket directory
/// `/run/postgresql:5432`), comma-separated; a `hostaddr` stands for its host. Never the
/// password, which is not part of it.
fn address(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let hosts: Vec<String> = match config.get_hostaddrs() {
        [] => config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                Host::Unix(path) => path.display().to_string(),
            })
            .collect(),
        addrs => addrs.iter().map(|a| a.to_string()).collect(),
    };
    let ports = config.get_ports();
    let port = |i: usize| match ports {
        [] => 5432,
        [one] => *one,
        many => many.get(i).copied().unwrap_or(5432),
    };
    let each: Vec<String> = match hosts.is_empty() {
        true => vec![format!("localhost:{}", port(0))],
        false => hosts
            .iter()
            .enumerate()
            .map(|(i, h)| match h.parse::<std::net::Ipv6Addr>() {
                Ok(_) => format!("[{h}]:{}", port(i)),
                Err(_) => format!("{h}:{}", port(i)),
            })
            .collect(),
    };
    each.join(",")
}

/// [`connect_with`], retried while the database cannot be reached yet ([`DbError::is_transient`]:
/// refused, timed out, starting up), for at most `within`: a database started beside the
/// processor is waited for (`within` zero: one attempt). Anything else (a refused password, no such database) fails at
/// once. After `within`, the last failure, which names the address once.
pub async fn connect_within(
    url: &str,
    size: usize,
    options: ConnectOptions,
    within: Duration,
) -> Result<Pool, DbError> {
    if within.is_zero() {
        return connect_with(url, size, options).await;
    }
    let deadline = tokio::time::Instant::now() + within;
    let mut delay = Duration::from_millis(100);
    let mut last = None;
    loop {
        let attempt = tokio::time::timeout_at(deadline, connect_with(url, size, options)).await;
        let failed = match attempt {
            Ok(Ok(pool)) => return Ok(pool),
            Ok(Err(e)) if e.is_transient() => e,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(last.unwrap_or_else(|| no_answer(url))),
        };
        if last.is_none() {
            tracing::info!(
                "{}; retrying for at most {} s",
                crate::one_line::chain(&failed),
                within.as_secs()
            );
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(failed);
        }
        last = Some(failed);
        tokio::time::sleep_until((now + delay).min(deadline)).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// The failure of a first attempt that got no answer at all before the deadline.
fn no_answer(url: &str) -> DbError {
    let at = tokio_postgres::Config::from_str(url).map_or_else(|_| String::new(), |c| address(&c));
    DbError::Connect {
        at,
        error: deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Create),
    }
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

/// The most connections [`warm`] opens: a larger pool fills as the load needs it.
const WARM_CONNECTIONS: usize = 16;

/// Opens the pool's free connections (up to [`WARM_CONNECTIONS`]) at once and prepares
/// `statements` on each, into the connection's statement cache, so that the first batches
/// neither connect nor plan. It never waits for a connection another task holds, and returns
/// each to the pool as soon as its statements are prepared. Best effort: a statement that fails
/// to prepare is left to the batch that needs it, which reports it.
pub(crate) async fn warm(pool: Pool, statements: Vec<String>) {
    let n = pool.status().max_size.min(WARM_CONNECTIONS);
    let free = deadpool_postgres::Timeouts {
        wait: Some(Duration::ZERO),
        ..pool.timeouts()
    };
    let clients = futures::future::join_all((0..n).map(|_| pool.timeout_get(&free))).await;
    let prepared = clients.into_iter().flatten().map(|client| async {
        for sql in &statements {
            if let Err(e) = client.prepare_cached(sql).await {
                tracing::debug!("warming a connection: {}", crate::one_line::pg_line(&e));
            }
        }
        drop(client);
    });
    futures::future::join_all(prepared).await;
}

/// Creates or upgrades the core's tables: applies the core's [`MIGRATIONS`] not yet applied,
/// in one transaction under the migration lock, and returns the versions applied now (empty
/// when the core is current). A handler with tables of its own migrates them apart (the ledger:
/// [`crate::handlers::ledger::migrate`]).
///
/// A database recorded by a release before migrations had owners is re-recorded first, in the
/// same transaction ([versions by owner](self#versions-by-owner)).
pub async fn migrate(pool: &Pool) -> Result<Vec<i32>, DbError> {
    schema::migrate(pool, CORE, MIGRATIONS).await
}

/// Fails with [`DbError::Schema`] unless every core migration has been applied (and with
/// [`DbError::LegacySchema`] when `schema_migrations` has not been re-recorded by owner yet).
pub async fn check_schema(pool: &Pool) -> Result<(), DbError> {
    schema::check(pool, CORE, MIGRATIONS, CORE_MIGRATE).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(url: &str) -> String {
        address(&tokio_postgres::Config::from_str(url).expect("a URL"))
    }

    #[test]
    fn the_address_names_each_host_with_its_port_and_never_the_password() {
        assert_eq!(
            at("postgres://app:Sup3r@db.internal/ledger"),
            "db.internal:5432"
        );
        assert_eq!(at("postgres://app@10.0.0.5:6432/ledger"), "10.0.0.5:6432");
        assert_eq!(at("postgres://app@[::1]:5433/ledger"), "[::1]:5433");
        assert_eq!(
            at("host=a,b port=5433,5434 user=app password=Sup3r dbname=x"),
            "a:5433,b:5434"
        );
        assert_eq!(at("host=a,b port=6000 user=app"), "a:6000,b:6000");
        assert_eq!(at("host=/run/postgresql user=app"), "/run/postgresql:5432");
        assert_eq!(
            at("host=db.internal hostaddr=192.0.2.7 user=app"),
            "192.0.2.7:5432"
        );
    }
}

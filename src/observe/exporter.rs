//! The operations listener (`--metrics-addr`): `/metrics` (Prometheus), `/healthz` (the process
//! answers) and `/readyz` (the database answers AND this group member has a partition).
//!
//! Invariant: probes never compete with the pipeline for connections. `/readyz` queries the
//! database through its own one-connection pool with a short timeout, so a busy pipeline cannot
//! make the process look unready and a down database cannot hang a probe.
//!
//! A group member with no partition (more members than partitions, or before the group join)
//! is reported not ready: it applies nothing. Liveness (`/healthz`) does not depend on it.
//!
//! Whoever can reach the listener learns only the kind of reason (`not ready: database`, `not
//! ready: no partition`); the detail (the driver's error, the database URL's password scrubbed
//! from it) goes to the log, at warn level when the reason changes.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use deadpool_postgres::Pool;

use crate::observe::stats::Stats;
use crate::secret::DatabaseUrl;

/// What the listener reports on.
#[derive(Clone)]
pub(crate) struct OpsState {
    /// The processor's counters and gauges.
    pub(crate) stats: Arc<Stats>,
    /// The processor's pool (for the connections-in-use gauge).
    pub(crate) pool: Pool,
    /// A separate small pool for the readiness query.
    pub(crate) probe: Pool,
    /// Longest wait for the readiness query.
    pub(crate) probe_timeout: Duration,
    /// The readiness pool's URL, whose password is scrubbed from the errors logged.
    pub(crate) database_url: DatabaseUrl,
    /// The outcome of the last probe ([`NotReady::code`], 0 when ready), to log changes once.
    reported: Arc<AtomicU8>,
}

/// Why the process is not ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotReady {
    /// The readiness query failed or timed out.
    #[error("database unreachable: {0}")]
    Database(String),
    /// The group gave this member no partition (yet).
    #[error("no partition assigned")]
    NoPartition,
    /// A partition waits on a failure that is not the message's fault.
    #[error("{0}")]
    Stalled(String),
}

impl NotReady {
    /// The body of `/readyz`: the kind of reason only, and for a stall the partitions and
    /// SQLSTATEs (names and codes, nothing an error's text could carry).
    pub(crate) fn body(&self) -> String {
        match self {
            NotReady::Database(_) => "not ready: database\n".to_owned(),
            NotReady::NoPartition => "not ready: no partition\n".to_owned(),
            NotReady::Stalled(reason) => format!("not ready: {reason}\n"),
        }
    }

    fn code(&self) -> u8 {
        match self {
            NotReady::Database(_) => 1,
            NotReady::NoPartition => 2,
            NotReady::Stalled(_) => 3,
        }
    }
}

impl OpsState {
    /// Checks the database (`SELECT 1` within the timeout), then the assignment. Returns the
    /// number of assigned partitions when ready.
    pub(crate) async fn readiness(&self) -> Result<i64, NotReady> {
        let query = async {
            let scrubbed = |text: String| self.database_url.scrub(&text);
            let client = self
                .probe
                .get()
                .await
                .map_err(|e| scrubbed(crate::one_line::pool_line(&e)))?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| scrubbed(crate::one_line::pg_line(&e)))
        };
        match tokio::time::timeout(self.probe_timeout, query).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(NotReady::Database(e)),
            Err(_) => {
                let ms = self.probe_timeout.as_millis();
                return Err(NotReady::Database(format!("no answer within {ms} ms")));
            }
        }
        if let Some(reason) = self.stats.telemetry.stalls.reason() {
            return Err(NotReady::Stalled(reason));
        }
        match self.stats.telemetry.assigned_partitions() {
            0 => Err(NotReady::NoPartition),
            n => Ok(n),
        }
    }

    /// Logs why the process is not ready: at warn level when the reason is new, at debug level
    /// when it repeats; the return to ready at info level.
    fn report(&self, outcome: &Result<i64, NotReady>) {
        let code = outcome.as_ref().map_or_else(NotReady::code, |_| 0);
        let changed = self.reported.swap(code, Ordering::Relaxed) != code;
        match outcome {
            Err(e) if changed => tracing::warn!("not ready: {e}"),
            Err(e) => tracing::debug!("not ready: {e}"),
            Ok(n) if changed => tracing::info!("ready again: {n} partition(s) assigned"),
            Ok(_) => {}
        }
    }
}

/// The routes, over `state`.
pub(crate) fn router(state: OpsState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(Arc::new(state))
}

/// Serves the routes on `listener` until `shutdown` resolves.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: OpsState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics(State(state): State<Arc<OpsState>>) -> impl IntoResponse {
    let status = state.pool.status();
    state.stats.telemetry.set_pool(
        status.size.saturating_sub(status.available),
        status.max_size,
    );
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.stats.telemetry.encode(),
    )
}

async fn ready(State(state): State<Arc<OpsState>>) -> (StatusCode, String) {
    let outcome = state.readiness().await;
    state.report(&outcome);
    match outcome {
        Ok(n) => (
            StatusCode::OK,
            format!("ready: database reachable, {n} partition(s) assigned\n"),
        ),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.body()),
    }
}

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExporterError {
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The readiness pool cannot connect.
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
}

/// Binds `addr`, connects the readiness pool to `database_url`, and serves in a task until
/// `stop` is cancelled. Returns the bound address (`addr` may use port 0).
pub async fn start(
    addr: std::net::SocketAddr,
    database_url: &str,
    pool: Pool,
    stats: Arc<Stats>,
    stop: tokio_util::sync::CancellationToken,
) -> Result<std::net::SocketAddr, ExporterError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ExporterError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ExporterError::Bind { addr, source })?;
    let state = OpsState {
        stats,
        pool,
        probe: crate::db::connect(database_url, 1).await?,
        probe_timeout: Duration::from_secs(2),
        database_url: DatabaseUrl::new(database_url),
        reported: Arc::default(),
    };
    tokio::spawn(async move {
        if let Err(e) = serve(listener, state, async move { stop.cancelled().await }).await {
            tracing::error!("metrics listener stopped: {e}");
        }
    });
    tracing::info!("serving /metrics, /healthz and /readyz on http://{bound}");
    Ok(bound)
}

//! The server side of a measurement: a fresh database, and the server's counters read before and
//! after a replay (CPU of the PostgreSQL processes, WAL position, checkpoints, statements).
//!
//! Invariant: every counter is read from the server the replay writes to, through one admin
//! connection to its `postgres` database, and nothing here changes a server setting.

use crate::cpu::{parent_pid, postgres_cpu_ticks, seconds};
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tokio_postgres::{Client, Config, NoTls};

/// An admin connection to the server's `postgres` database.
pub struct Server {
    client: Client,
    postmaster: Option<u32>,
}

/// Server counters at one instant.
#[derive(Debug, Clone)]
pub struct Counters {
    wal_lsn: String,
    redo_lsn: String,
    wal_records: i64,
    wal_fpi: i64,
    wal_syncs: i64,
    pg_cpu_ticks: Option<u64>,
}

/// The server's work between two [`Counters`].
#[derive(Debug, Clone, Serialize)]
pub struct Delta {
    /// WAL bytes written (the whole server).
    pub wal_bytes: i64,
    /// WAL records written.
    pub wal_records: i64,
    /// Full-page images among them.
    pub wal_fpi: i64,
    /// WAL flushes to disk (one COMMIT's flush can cover other transactions' commits).
    pub wal_syncs: i64,
    /// Whether a checkpoint started during the run (it adds full-page images to the WAL).
    pub checkpoint_in_run: bool,
    /// CPU seconds of the PostgreSQL processes; `None` when the server is not on this machine.
    pub pg_cpu_s: Option<f64>,
}

/// One statement's totals from `pg_stat_statements`.
#[derive(Debug, Clone, Serialize)]
pub struct StatementStats {
    /// The statement, normalized, cut to 160 characters.
    pub query: String,
    /// Executions.
    pub calls: i64,
    /// Total execution time, ms.
    pub total_ms: f64,
    /// Mean execution time, ms.
    pub mean_ms: f64,
    /// Rows returned or affected.
    pub rows: i64,
    /// WAL bytes generated.
    pub wal_bytes: i64,
    /// Full-page images in that WAL.
    pub wal_fpi: i64,
}

impl Server {
    /// Connects to database `postgres` of the server at `url`.
    pub async fn connect(url: &str) -> Result<Self> {
        let mut config = Config::from_str(url).context("server URL")?;
        config.dbname("postgres");
        let (client, connection) = config.connect(NoTls).await.context("connect")?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("admin connection: {e}");
            }
        });
        let backend: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let postmaster = parent_pid(backend as u32);
        Ok(Self { client, postmaster })
    }

    /// A server setting's value.
    pub async fn setting(&self, name: &str) -> Result<String> {
        let row = self
            .client
            .query_one("SELECT current_setting($1)", &[&name])
            .await?;
        Ok(row.get(0))
    }

    /// Drops database `name` if it exists and creates it empty.
    pub async fn fresh_database(&self, name: &str) -> Result<()> {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        self.client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
            .await?;
        self.client
            .batch_execute(&format!("CREATE DATABASE {quoted}"))
            .await?;
        Ok(())
    }

    /// Flushes dirty pages, so that every run starts right after a checkpoint.
    pub async fn checkpoint(&self) -> Result<()> {
        Ok(self.client.batch_execute("CHECKPOINT").await?)
    }

    /// Empties `pg_stat_statements`; false when the extension is not loaded.
    pub async fn reset_statements(&self) -> bool {
        let created = self
            .client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await;
        created.is_ok()
            && self
                .client
                .batch_execute("SELECT pg_stat_statements_reset()")
                .await
                .is_ok()
    }

    /// The statements run in database `db` since the last reset, most total time first.
    pub async fn statements(&self, db: &str) -> Result<Vec<StatementStats>> {
        let rows = self
            .client
            .query(
                "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 160), calls,
                        total_exec_time, mean_exec_time, rows, wal_bytes::bigint, wal_fpi
                 FROM pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)
                 ORDER BY total_exec_time DESC",
                &[&db],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| StatementStats {
                query: r.get(0),
                calls: r.get(1),
                total_ms: r.get(2),
                mean_ms: r.get(3),
                rows: r.get(4),
                wal_bytes: r.get(5),
                wal_fpi: r.get(6),
            })
            .collect())
    }

    /// Reads the counters now. Backends report their WAL statistics when idle or at exit: read
    /// the end's after the replay's connections have closed ([`Server::wait_for_no_sessions`]).
    pub async fn counters(&self) -> Result<Counters> {
        let row = self
            .client
            .query_one(
                "SELECT pg_current_wal_lsn()::text, (pg_control_checkpoint()).redo_lsn::text,
                        wal_records, wal_fpi, wal_sync FROM pg_stat_wal",
                &[],
            )
            .await?;
        Ok(Counters {
            wal_lsn: row.get(0),
            redo_lsn: row.get(1),
            wal_records: row.get(2),
            wal_fpi: row.get(3),
            wal_syncs: row.get(4),
            pg_cpu_ticks: self.cpu_ticks(),
        })
    }

    /// Waits (up to 10 s) until no session is connected to database `db`.
    pub async fn wait_for_no_sessions(&self, db: &str) -> Result<()> {
        for _ in 0..1000 {
            let row = self
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                    &[&db],
                )
                .await?;
            if row.get::<_, i64>(0) == 0 {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        bail!("sessions of {db} still connected after 10 s")
    }

    /// CPU ticks of the server's processes now; `None` when the server is not on this machine.
    /// Read it while the sessions to measure are alive: a backend that is exiting can be missed.
    pub fn cpu_ticks(&self) -> Option<u64> {
        self.postmaster.and_then(postgres_cpu_ticks)
    }

    /// What the server did since `before`, with the CPU ticks `cpu_at_end` read at the end of the
    /// work ([`Server::cpu_ticks`]).
    pub async fn since(&self, before: &Counters, cpu_at_end: Option<u64>) -> Result<Delta> {
        let now = self.counters().await?;
        let wal_bytes: i64 = self
            .client
            .query_one(
                "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::bigint",
                &[&now.wal_lsn, &before.wal_lsn],
            )
            .await?
            .get(0);
        let pg_cpu_s = match (before.pg_cpu_ticks, cpu_at_end) {
            (Some(a), Some(b)) => Some(seconds(b.saturating_sub(a))),
            _ => None,
        };
        Ok(Delta {
            wal_bytes,
            wal_records: now.wal_records - before.wal_records,
            wal_fpi: now.wal_fpi - before.wal_fpi,
            wal_syncs: now.wal_syncs - before.wal_syncs,
            checkpoint_in_run: now.redo_lsn != before.redo_lsn,
            pg_cpu_s,
        })
    }
}

//! The replay's report: per-record figures derived from the run's totals, printed as text and
//! appended to a JSON-lines file.
//!
//! Invariant: every per-record figure divides by the records received (duplicates and bad input
//! included), the same denominator as the load test's msgs/s.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::apply::Replayed;
use super::server::{Delta, StatementStats};
use super::Args;

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    label: String,
    mode: String,
    records: u64,
    batch_size: usize,
    partitions: i32,
    pool_size: usize,
    setup: Vec<String>,
    fsync: String,
    synchronous_commit: String,
    seconds: f64,
    records_per_s: f64,
    transactions: u64,
    retries: u64,
    new: u64,
    duplicates: u64,
    rejected: u64,
    invalid: u64,
    pg_cpu_us_per_record: Option<f64>,
    replay_cpu_us_per_record: f64,
    machine_busy: f64,
    wal_bytes_per_record: f64,
    wal_records_per_record: f64,
    wal_fpi: i64,
    wal_syncs_per_transaction: f64,
    checkpoint_in_run: bool,
    statements_per_record: Option<f64>,
    statements_per_transaction: Option<f64>,
    /// Mean time per transaction in each step, ms: dedup, handler, dead letters, commit.
    step_ms: [f64; 4],
    tx_p50_ms: f64,
    tx_p99_ms: f64,
    statements: Option<Vec<StatementStats>>,
    differences: Vec<String>,
}

impl Report {
    /// The figures of `replayed`, with the server's `delta` and the replay's own CPU seconds.
    pub fn new(
        args: &Args,
        (fsync, synchronous_commit): (String, String),
        replayed: &Replayed,
        delta: Delta,
        own_cpu_s: f64,
        machine_busy: f64,
    ) -> Self {
        let records = replayed.outcome.received;
        let per_record = |x: f64| x / records.max(1) as f64;
        let tx = replayed.transactions.max(1) as f64;
        let t = &replayed.outcome.timings;
        let step_ms =
            [t.dedup, t.handler, t.dead_letters, t.commit].map(|d| d.as_secs_f64() * 1e3 / tx);
        Self {
            label: args.label.clone(),
            mode: format!("{:?}", args.mode),
            records,
            batch_size: match args.mode {
                batch_inbox::Mode::PerMessage => 1,
                _ => args.batch_size,
            },
            partitions: args.partitions,
            pool_size: args.pool_size,
            setup: args.setup.iter().map(|p| p.display().to_string()).collect(),
            fsync,
            synchronous_commit,
            seconds: replayed.elapsed.as_secs_f64(),
            records_per_s: records as f64 / replayed.elapsed.as_secs_f64().max(1e-9),
            transactions: replayed.transactions,
            retries: replayed.retries,
            new: replayed.outcome.new,
            duplicates: replayed.outcome.duplicates,
            rejected: replayed.outcome.rejected,
            invalid: replayed.outcome.invalid,
            pg_cpu_us_per_record: delta.pg_cpu_s.map(|s| per_record(s * 1e6)),
            replay_cpu_us_per_record: per_record(own_cpu_s * 1e6),
            machine_busy,
            wal_bytes_per_record: per_record(delta.wal_bytes as f64),
            wal_records_per_record: per_record(delta.wal_records as f64),
            wal_fpi: delta.wal_fpi,
            wal_syncs_per_transaction: delta.wal_syncs as f64 / tx,
            checkpoint_in_run: delta.checkpoint_in_run,
            statements_per_record: None,
            statements_per_transaction: None,
            step_ms,
            tx_p50_ms: replayed.tx_us.value_at_quantile(0.5) as f64 / 1e3,
            tx_p99_ms: replayed.tx_us.value_at_quantile(0.99) as f64 / 1e3,
            statements: None,
            differences: Vec::new(),
        }
    }

    /// Adds the statements of the run (`None`: `pg_stat_statements` is not loaded).
    pub fn with_statements(mut self, statements: Option<Vec<StatementStats>>) -> Self {
        if let Some(list) = &statements {
            let calls: i64 = list.iter().map(|s| s.calls).sum();
            self.statements_per_record = Some(calls as f64 / self.records.max(1) as f64);
            self.statements_per_transaction = Some(calls as f64 / self.transactions.max(1) as f64);
        }
        self.statements = statements;
        self
    }

    /// Adds the differences between the database and the model (empty: verified).
    pub fn with_differences(mut self, differences: Vec<String>) -> Self {
        self.differences = differences;
        self
    }

    /// Whether the database matched the model exactly.
    pub fn verified(&self) -> bool {
        self.differences.is_empty()
    }

    /// Prints the figures, and the `top` statements by total time.
    pub fn print(&self, top: usize) {
        let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
        println!(
            "{}: {} records in {:.2} s = {:.0} records/s; PG CPU {} µs/record, replay CPU {:.2} \
             µs/record, machine {:.0}% busy; WAL {:.0} B/record ({:.2} records, {} FPI, {:.2} syncs/tx{}); \
             {} statements/record ({} per tx); tx p50 {:.1} ms p99 {:.1} ms; step ms {:.2?}; retries {}; {}",
            self.label,
            self.records,
            self.seconds,
            self.records_per_s,
            opt(self.pg_cpu_us_per_record),
            self.replay_cpu_us_per_record,
            self.machine_busy * 100.0,
            self.wal_bytes_per_record,
            self.wal_records_per_record,
            self.wal_fpi,
            self.wal_syncs_per_transaction,
            if self.checkpoint_in_run { ", CHECKPOINT in run" } else { "" },
            opt(self.statements_per_record),
            opt(self.statements_per_transaction),
            self.tx_p50_ms,
            self.tx_p99_ms,
            self.step_ms,
            self.retries,
            if self.verified() {
                "verified".to_owned()
            } else {
                format!("MISMATCH {:?}", self.differences)
            },
        );
        for s in self.statements.iter().flatten().take(top) {
            println!(
                "  {:>9.1} ms {:>7} calls {:>8.3} ms/call {:>9} rows {:>7.0} WAL B/call {:>5} FPI  {}",
                s.total_ms,
                s.calls,
                s.mean_ms,
                s.rows,
                s.wal_bytes as f64 / s.calls.max(1) as f64,
                s.wal_fpi,
                s.query
            );
        }
    }

    /// Appends the report as one JSON line to `path`.
    pub fn append_to(&self, path: &Path) -> Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("open {}", path.display()))?;
        let line = serde_json::to_string(self)?;
        writeln!(file, "{line}").with_context(|| format!("write {}", path.display()))
    }
}

//! # batch-inbox
//!
//! Applies a Kafka topic to PostgreSQL exactly once, with a micro-batched transactional inbox.
//!
//! ```text
//! Kafka ─► consumer group member (one queue per assigned partition)
//!            ─► batcher (per partition: size / bytes / linger)
//!            ─► decoder (id header → UUID, value → payload; bad → dead letter)
//!            ─► inbox transaction, one per batch:
//!                 in-batch dedup · INSERT … unnest … ON CONFLICT DO NOTHING RETURNING
//!                 · handler(tx, new messages only) · dead letters
//!                 · the partition's next offset (consumer_offsets) · COMMIT
//!            ─► offset store (only after COMMIT) ─► Kafka offset commit
//! ```
//!
//! **Guarantee.** Each valid message's effect is committed at most once per message id (the
//! inbox's primary key, in the same transaction as the effect), and at least once (offsets are
//! stored only after the COMMIT that covers them). Together: exactly once per id, as long as the
//! inbox still holds the id when a copy arrives.
//!
//! A service implements [`Handler`]; [`ledger::Ledger`] is the reference implementation.
//! [`retention`] keeps the inbox from growing without bound (batched deletes, or daily partitions
//! by UUIDv7 time dropped whole) and guards the dedup window it leaves.

pub mod batcher;
pub mod config;
pub mod config_file;
pub mod consumer;
pub mod days;
pub mod db;
pub mod db_tls;
pub mod dead_letter;
pub mod defaults;
pub mod drain;
pub mod error;
pub mod exporter;
pub mod failpoint;
pub mod handler;
pub mod inbox;
pub mod ledger;
pub mod logging;
pub mod message;
pub mod metrics;
pub mod offset_table;
pub mod offsets;
pub mod outcome;
pub mod processor;
pub mod reason;
pub mod resume;
pub mod retention;
pub mod secret;
pub mod sql;
pub mod stats;
pub mod stats_file;
pub mod telemetry;
pub mod unsafe_controls;
pub mod worker;

/// The transaction a handler works in.
pub use deadpool_postgres::Transaction;
pub use handler::{Handler, Rejection};
pub use inbox::Mode;
pub use processor::{run, ProcessorConfig};

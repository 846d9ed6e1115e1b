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
//! **Embedding it**: a handler that records each new page view, run until the process stops.
//!
//! ```no_run
//! use std::{future::pending, sync::Arc};
//! use batch_inbox::{db, Decode, Handler, HandlerError, KafkaSettings, Message, ProcessorConfig};
//! use batch_inbox::{RawMessage, Reason, Rejection, Transaction};
//!
//! #[derive(Clone)]
//! struct View(String);
//!
//! impl Decode for View {
//!     fn decode(raw: &RawMessage) -> Result<Self, (Reason, String)> {
//!         let value = std::str::from_utf8(raw.payload.as_deref().unwrap_or_default());
//!         value.map(|v| View(v.to_owned())).map_err(|e| (Reason::InvalidPayload, e.to_string()))
//!     }
//! }
//!
//! struct Views;
//!
//! impl Handler for Views {
//!     type Payload = View;
//!     async fn handle(
//!         &self,
//!         tx: &Transaction<'_>,
//!         new: &[Message<View>],
//!     ) -> Result<Vec<Rejection>, HandlerError> {
//!         let paths: Vec<&str> = new.iter().map(|m| m.payload.0.as_str()).collect();
//!         tx.execute("INSERT INTO views (path) SELECT unnest($1::text[])", &[&paths]).await?;
//!         Ok(Vec::new()) // none refused
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     let pool = db::connect("postgres://postgres@127.0.0.1/shop", 8).await?;
//!     db::migrate(&pool).await?; // the inbox, dead letters and offsets tables
//!     let kafka = KafkaSettings::new("127.0.0.1:9092", "page-views", "views-to-postgres");
//!     batch_inbox::run(ProcessorConfig::new(kafka), pool, Arc::new(Views), pending()).await?;
//!     Ok(())
//! }
//! ```
//!
//! ## Using it
//!
//! A service implements [`Handler`] (its payload type implements [`Decode`]) and calls [`run`]
//! with a [`ProcessorConfig`] and a pool from [`db::connect`], after [`db::migrate`] (the core's
//! tables; a handler's own come apart, the ledger's from [`ledger::migrate`]). The handler
//! gets only messages whose ids are new, in partition order, and only the batch's
//! [`Transaction`]; it returns the messages it refuses ([`Rejection`], with a [`Reason`] it
//! names). [`ledger::Ledger`] is the reference implementation; [`SqlHandler`] runs one SQL
//! statement per batch instead of Rust code (docs/SQL-HANDLER.md); [`retention`] keeps the inbox from
//! growing without bound and guards the dedup window it leaves; [`redrive`] applies parked dead
//! letters through a handler once their cause is fixed, exactly once. [`Stats`] counts a run as
//! it goes; [`stats_file`] holds the run report that `run --stats-file` writes and the load
//! tools read.
//!
//! ## Other crates' types in the API
//!
//! The API names its own types, except where a user hands one in or gets one to work with; those
//! crates' versions are then part of this crate's:
//! - `deadpool_postgres::Pool` (0.14): the pool [`run`] and the database functions take, made by
//!   [`db::connect`] or by the caller;
//! - [`Transaction`] (`deadpool_postgres::Transaction`): the batch's transaction a [`Handler`]
//!   works in, with every `tokio_postgres` call on it;
//! - `tokio_postgres::Error` (0.7): the cause that [`HandlerError::Db`] carries, so that a handler
//!   can use `?` on its statements and the inbox can classify them by SQLSTATE;
//! - `rdkafka::ClientConfig` (0.39): [`KafkaSettings::client_config`], the librdkafka
//!   configuration the processor creates its consumer from, for a caller that checks it.
//!
//! ## Layout
//!
//! The modules, in data-flow order. Public: `batcher`, `days`, `db`, `defaults`, `exporter`,
//! `inbox`, `ledger`, `message`, `redrive`, `retention`, `secret`, `sql`, `stats_file` and
//! `worker`; the root re-exports what an embedding service needs. The command line is the
//! binary's (`src/cli/`), not the library's.
//!
//! - `defaults`, `names`, `secret`: every default, settings as text, and the secrets never shown.
//! - `consumer`: the group member (librdkafka), one queue per partition, rebalances, headers read
//!   as bytes, refused settings; `drain`: when `exit_on_eof` may exit; `resume`: start offsets
//!   from the database.
//! - `batcher`: the pure per-partition micro-batcher (size / bytes / linger).
//! - `message`: the owned record and its decoding (ids, payloads, dead letters); `reason`: why a
//!   message is not applied; `days`: UUIDv7 time.
//! - `worker`: one partition's loop: batches, retries, poison isolation, offsets stored only
//!   after COMMIT (`offsets`: the contiguous committed position); fed by Kafka or any source.
//! - `inbox`: the transaction (dedup, handler, dead letters, next offset, COMMIT);
//!   `dead_letter`: storable dead-letter rows; `offset_table`: offsets in the database; `sql`:
//!   every statement; `handler`: the business trait; `ledger`: the reference handler;
//!   `sql_handler`: the handler made of one SQL statement.
//! - `processor`: the wiring of the above.
//! - `outcome`, `stats`, `telemetry`, `metrics`, `stats_file`, `exporter`: what a run did,
//!   observed once and shown as counters, Prometheus metrics, the stats file and the probes.
//! - `redrive`: dead letters listed and re-driven through the handler (the inbox's own dedup and
//!   handler step, `inbox::apply_within`), marked, never deleted.
//! - `retention`, `db`, `db_tls`, `error`, `failpoint`, `unsafe_controls`: inbox retention, the
//!   pool, migrations and the grants checked at start, TLS, error types, and the test-only hooks.
#![warn(missing_docs, unreachable_pub, unnameable_types)]

pub mod batcher;
mod consumer;
pub mod days;
pub mod db;
mod db_tls;
mod dead_letter;
pub mod defaults;
mod drain;
mod error;
pub mod exporter;
mod failpoint;
mod handler;
pub mod inbox;
pub mod ledger;
pub mod message;
mod metrics;
mod names;
mod offset_table;
mod offsets;
mod outcome;
pub mod positions;
mod processor;
mod reason;
pub mod redrive;
mod resume;
pub mod retention;
pub mod secret;
pub mod sql;
mod sql_handler;
mod stats;
pub mod stats_file;
mod telemetry;
mod topic_id;
mod unsafe_controls;
pub mod worker;

pub use batcher::{BatcherSettings, Batching};
pub use consumer::KafkaSettings;
pub use db::Transaction;
pub use error::{
    one_line_error, DbError, Fault, HandlerError, InboxError, KafkaClientError, KafkaStartupError,
    RefusedSetting, RunError,
};
pub use handler::{Handler, Rejection};
pub use inbox::Mode;
pub use message::{Decode, Header, Message, RawMessage};
pub use names::{parse_interval, Named, UnknownName, MAX_INTERVAL};
pub use processor::{run, run_with_stats, ProcessorConfig};
pub use reason::{InvalidReason, Reason, RejectReason};
pub use sql_handler::{JsonPayload, RouteError, SqlError, SqlFileError, SqlHandler, SqlStatement};
pub use stats::{Stats, StatsSnapshot};
pub use unsafe_controls::UnsafeControls;
pub use worker::{RetryPolicy, WorkerSettings};

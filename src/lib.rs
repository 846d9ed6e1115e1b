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
//! - `rdkafka::error::KafkaError` (0.39): the cause [`RunError::Kafka`] carries;
//! - `deadpool_postgres::PoolError` (0.14): the cause of the pool variants of the errors
//!   ([`ServiceError::Pool`], [`retention::RetentionError::Pool`]);
//! - `tokio_util::sync::CancellationToken` (0.7): how a caller stops [`retention::maintain`]
//!   and a [`retention::cleanup`] in progress.
//!
//! ## Layout
//!
//! The folders follow a record's way (docs/ARCHITECTURE.md walks it, with each stage's
//! invariant and tests); no module uses one of a higher floor, and none a circle
//! (`scripts/module-graph.py --check`, every level):
//!
//! - `source`: where records come from, behind one seam (`source.rs`: a source starts a run of
//!   the pipeline for each partition it is given, feeds it the partition's records and gets
//!   back the committed positions; what a RabbitMQ or JetStream source supplies is written
//!   there), the owned record (`record`), positions in the database (`positions`) and keys
//!   derived from positions (`key`). `source::kafka`: the group member and its partition queues
//!   (`consumer`), where an assigned partition starts (`resume`: the database's position), the
//!   topic ids (`topic_id`), and when `--exit-on-eof` may exit (`drain`).
//! - `pipeline`: the per-partition micro-batcher (`batcher`), decoding (`message`), the
//!   partition's loop with retries, poison isolation and the breaker (`worker`), the business
//!   trait (`handler`), the inbox transaction (`inbox`, `dead_letter`), the committed position
//!   for the source (`offsets`), and every default (`defaults`). It knows no broker type.
//! - `handlers`: the ledger (the reference) and the handler made of one SQL statement.
//! - `observe`: what a run did, counted once (`outcome`, `stats`) and shown as Prometheus
//!   metrics (`telemetry`), the stats file (`metrics`, `stats_file`) and the probes (`exporter`).
//! - `maintenance`: retention, the redrive of dead letters, and positions moved by an operator.
//! - `db`: the pool, migrations, grants checked at start, TLS (`tls`), every statement (`sql`)
//!   and the database's error.
//! - `processor`: the wiring of the above (the Kafka source started with a partition worker per
//!   partition), which [`run`] is; `service`: what the binary's `run`
//!   does around it (start-up checks, retention, the listener, the stats file), for a service
//!   that embeds the library with its own handler ([`Service`]).
//! - `error`: the processor's error ([`RunError`]) and the few the source and the pipeline share
//!   (each says why it is there); every other error is its own module's, and the root
//!   re-exports each.
//! - Leaves: `fault` (whose a database failure is), `one_line` (an error said on one line),
//!   `reason` (why a message is not applied), `names` (settings as text), `days` (UUIDv7 time),
//!   `secret` (what is never shown), `failpoint`, `unsafe_controls`.
//!
//! Public: the root's items (what an embedding service writes: the handler trait and its
//! types, the settings, the entry points, the errors) and the modules `db`, `key`, `ledger`,
//! `positions`, `redrive`, `retention` and `stats_file`. Everything else is the crate's own; the
//! binary's command line (`src/cli/`), the tests, the load tools and the benches reach what they
//! need of it through one hidden door, `internals`, which is not part of the API.
#![warn(missing_docs, unreachable_pub, unnameable_types)]

pub mod db;
mod handlers;
mod maintenance;
mod observe;
mod pipeline;
mod processor;
mod service;
mod source;

mod days;
mod error;
mod failpoint;
mod fault;
mod flags;
mod names;
mod one_line;
mod reason;
mod secret;
mod unsafe_controls;

#[doc(hidden)]
pub mod internals;

pub use handlers::ledger;
pub use maintenance::{positions, redrive, retention};
pub use source::key;

/// The run report that a [`Service`] writes to [`ServiceConfig::stats_file`] (`run
/// --stats-file`): the settings of the run and what it did, rewritten periodically while it runs
/// and once more when it stops, replaced atomically. The load tools read it; a service reads its
/// counters with [`Stats::snapshot`].
pub mod stats_file {
    pub use crate::observe::stats_file::{Measured, Percentiles, RunSettings, StatsReport};
}

// The handler and its messages.
pub use db::Transaction;
pub use pipeline::handler::{Handler, Rejection};
pub use pipeline::message::{
    Decode, Decoding, Header, IdFormat, IdRules, IdSource, Message, RawMessage, Tombstones,
    ValueFormat,
};
pub use reason::{InvalidReason, Reason, RejectReason};

// The settings and the entry points.
pub use pipeline::batcher::{BatcherSettings, Batching};
pub use pipeline::inbox::Mode;
pub use pipeline::worker::{PoisonLimit, PoisonRate, PoisonShare, RetryPolicy, WorkerSettings};
pub use processor::{run, run_with_stats, ProcessorConfig};
pub use secret::DatabaseUrl;
pub use service::{Service, ServiceConfig};
pub use source::amqp::{AmqpSettings, AmqpUrl, QueueType};
pub use source::kafka::consumer::KafkaSettings;
pub use source::nats::{NatsSettings, NatsUrl};
pub use unsafe_controls::UnsafeControls;

// What a run did.
pub use observe::stats::{Stats, StatsSnapshot};

// The errors, each its module's, and how the binary says one.
pub use db::DbError;
pub use error::{
    one_line_error, HandlerError, InboxError, KafkaClientError, RefusedSetting, RunError,
};
pub use fault::Fault;
pub use handlers::sql_handler::{RouteError, SqlError, SqlFileError};
pub use maintenance::{
    positions::PositionsError, redrive::RedriveError, retention::RetentionError,
};
pub use names::UnknownName;
pub use observe::exporter::ExporterError;
pub use service::ServiceError;
pub use source::amqp::AmqpError;
pub use source::kafka::consumer::KafkaStartupError;
pub use source::nats::NatsError;

// The handlers that ship with it: the ledger is a module (above), the SQL handler is these.
pub use handlers::sql_handler::{JsonPayload, SqlHandler, SqlStatement};

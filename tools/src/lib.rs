//! # batch-inbox-tools
//!
//! The toolbox of batch-inbox, kept apart from the product (nothing in the product depends on
//! it; `publish = false`): what tests, load tests and fault tests need around a processor, and
//! that no production deployment should carry.
//!
//! ## Layout
//!
//! - [`generate`]: the seeded load generator (ledger records with duplicates, bad input and
//!   overdrafts) and its model, the expected outcome.
//! - [`produce`]: writes records to a topic, at a constant rate or as fast as possible.
//! - [`amqp_publish`], [`nats_publish`]: publish them to RabbitMQ queues or a NATS JetStream
//!   stream, each account's records in order, every publish confirmed.
//! - [`verify`]: compares the database with the model.
//! - [`demo`]: the whole pipeline against an in-process mock cluster, in a database of its own.
//! - [`drain`]: one load-test run of the `batch-inbox` binary, read through its `--stats-file`.
//! - [`report`]: a load-test run's report; [`summary`]: the load test's tables and plots.
//! - [`measure`]: the COPY ceiling and pg_stat_statements counts; [`replay`]: the database-only
//!   ceiling, the same batches and statements driven from memory.
//! - [`chaos`]: the fault-injection driver, its invariant checker, and the table of a
//!   directory of runs.
//! - [`delay_proxy`]: a TCP proxy that delays every byte: a database on another host.
//! - [`cpu`]: CPU seconds from `/proc` (a process, a broker, PostgreSQL, the machine), and the
//!   `cpu` subcommand the scripts measure their runs with; [`peers`]: the comparison with the
//!   peers (`scripts/peers/`): result rows, the model's counts, the results' tables.
//! - [`machine`]: what a result was measured on (the load test's `machine.json`).
//! - [`recovery`]: the database going back in time (`scripts/failover.sh`,
//!   `scripts/restore.sh`): the record-by-record check and the runs' reports.
//! - [`kafka_output`]: what Apache Kafka's tools and logs say (lag, offsets, ISR changes), read
//!   for the scripts.
//! - [`replay_compare`]: the replay runs of `scripts/replay-compare.sh` and their table.
//! - [`group_protocol`], [`outage_lines`]: the tables of `scripts/group-protocol-compare.sh` and
//!   `scripts/outage-lines.sh`.
//! - [`json_get`]: values of a JSON document, for a script's conditions and messages.
//! - [`soak`]: the soak, a processor watched once a minute for many minutes, and its table and
//!   plot per minute.
//!
//! The scripts start brokers, databases and processes and call these subcommands: what is
//! measured, merged, checked or summed is computed here, with unit tests.

pub mod amqp_publish;
pub mod chaos;
pub mod cli;
pub mod cpu;
pub mod delay_proxy;
pub mod demo;
pub mod drain;
pub mod generate;
pub mod group_protocol;
pub mod json_get;
pub mod kafka_output;
pub mod machine;
pub mod measure;
pub mod nats_publish;
pub mod outage_lines;
pub mod peers;
pub mod produce;
/// The product's shared flags (database, Kafka, pipeline): the ones the binary takes.
pub use batch_inbox::internals::flags as product_args;
pub mod recovery;
pub mod replay;
pub mod replay_compare;
pub mod report;
pub mod soak;
pub mod summary;
pub mod verify;

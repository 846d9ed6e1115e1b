//! The integration tests, one binary (one link of librdkafka and the PostgreSQL client instead
//! of one per file): each module is one former test file, against the real PostgreSQL, the mock
//! cluster or a real broker process, each on its own database and topic.

mod common;

mod amqp;
mod bad_input;
mod broker_fetch;
mod cli;
mod concurrency;
mod config_file;
mod db_start_offsets;
mod db_tls;
mod dead_letter_rows;
mod deploy_metrics;
mod e2e;
mod environment;
mod exit_on_eof;
#[cfg(feature = "failpoints")]
mod faults;
mod group_protocol;
mod hostile_records;
mod kafka_revoke;
mod kafka_security;
mod migrations;
mod nats;
mod natural_batching;
mod ops;
mod outages;
mod paced_producer;
mod panic;
mod partitions;
mod pipeline;
mod plans;
mod poison;
mod positions;
mod readyz;
mod rebalance;
mod rebalance_faults;
mod record_bytes;
mod redrive;
mod retention;
mod retry;
mod secrets;
mod service;
mod sql_handler;
mod stalls;
mod startup;
mod statements;
mod topic_changes;
mod topic_reset;
mod topic_retention;
mod transactions;
mod unsafe_settings;
mod worker_gaps;
mod worker_stop;

//! Where records come from: a broker's records, partition by partition, and the acknowledgement
//! of what has committed.
//!
//! Invariant: a source hands the pipeline each partition's records in order, on one queue per
//! partition, and learns a position is done only after the database committed it. Kafka is the
//! one source today (`kafka`); what another one must provide is written in docs/ARCHITECTURE.md.

pub(crate) mod kafka;

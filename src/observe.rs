//! What a run did, observed once (`outcome`, `stats`) and shown five ways: Prometheus metrics
//! (`telemetry`), the measurements behind the stats file (`metrics`), the stats file itself
//! (`stats_file`), the HTTP listener with the probes (`exporter`) and the summary log lines
//! (`summary`).
//!
//! Invariant: every counter is counted at one place, the batch's outcome, and each view reads
//! it; nothing here changes what the pipeline does.

pub(crate) mod exporter;
pub(crate) mod metrics;
pub(crate) mod outcome;
pub(crate) mod stats;
pub(crate) mod stats_file;
pub(crate) mod summary;
pub(crate) mod telemetry;

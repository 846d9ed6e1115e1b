//! What a run did, observed once (`outcome`, `stats`) and shown four ways: Prometheus metrics
//! (`telemetry`), the measurements behind the stats file (`metrics`), the stats file itself
//! (`stats_file`) and the HTTP listener with the probes (`exporter`).
//!
//! Invariant: every counter is counted at one place, the batch's outcome, and each view reads
//! it; nothing here changes what the pipeline does.

pub mod exporter;
pub(crate) mod metrics;
pub(crate) mod outcome;
pub(crate) mod stats;
pub mod stats_file;
pub(crate) mod telemetry;

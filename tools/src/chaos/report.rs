//! What a chaos run writes to `results/`, and the tallies it takes from the processors' logs and
//! reports.
//!
//! Every incarnation of every member leaves a log and a report rewritten every 250 ms (a killed
//! process keeps its last one), so counters are summed over all processes that ever ran. Replays
//! (records processed again after their batch had committed) are counted as committed records
//! beyond the input, a lower bound: a killed process loses at most its last 250 ms of counts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::checker::Invariant;
use super::members::UnexpectedExit;
use super::nemesis::FaultEvent;
use super::offsets::{PartitionLag, Samples};
use batch_inbox::stats_file::StatsReport;

/// Counts from the processors' logs and reports, over every incarnation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tally {
    /// Processes started.
    pub processes: u64,
    /// "partition assigned" events.
    pub partition_assignments: u64,
    /// Revoke events (one per revoke callback).
    pub revokes: u64,
    /// Assignments beyond each partition's first: partitions that moved between members.
    pub partition_moves: u64,
    /// Failed batch attempts that were retried (from the logs, killed processes included).
    pub retries_logged: u64,
    /// Retries in the reports.
    pub retries_reported: u64,
    /// Records in committed transactions, summed over processes.
    pub records_committed: u64,
    /// Records skipped as duplicates, summed over processes.
    pub duplicates_skipped: u64,
    /// Committed transactions, summed over processes.
    pub transactions: u64,
    /// Records not read again because the offset stored in the database was ahead of Kafka's.
    pub replays_avoided: u64,
    /// Offset stores refused because the partition was no longer assigned.
    pub offsets_refused: u64,
    /// Offset gaps the partition workers logged (records the source skipped).
    pub offset_gaps: u64,
    /// Partitions read again from the database's position because the database went back in
    /// time (WARN lines: at assignment, or noticed by a running worker), and, on NATS, a
    /// stream's position moved back to a delivery that came back below what a run reached.
    pub positions_rewound: u64,
    /// NATS: consumers created again at the database's position because they had delivered past
    /// it what no run committed (the deliveries of a reader that stopped: killed, paused past its
    /// lock, cut from the database or the server).
    pub consumers_recreated: u64,
    /// NATS: each such move back as it was announced ("a delivery came back below what this run
    /// reached, not held by it: reading again from it").
    #[serde(skip)]
    pub rewinds_announced: Vec<Rewind>,
}

impl Tally {
    /// Adds one incarnation's log and report.
    pub fn add(&mut self, log: &Path, report: &Path) {
        self.processes += 1;
        if let Ok(text) = std::fs::read_to_string(log) {
            for line in text.lines() {
                if line.contains("partition assigned") {
                    self.partition_assignments += 1;
                } else if line.contains("revoked") {
                    self.revokes += 1;
                } else if line.contains("will retry") {
                    self.retries_logged += 1;
                } else if line.contains("offset gap") {
                    self.offset_gaps += 1;
                } else if line.contains("WARN") && line.contains("reading again from it") {
                    self.positions_rewound += 1;
                    if let Some(at) = announced_rewind(line) {
                        self.rewinds_announced.push(at);
                    }
                } else if line.contains("WARN")
                    && line.contains("delivered past the database's position what no run committed")
                {
                    self.consumers_recreated += 1;
                } else if line.contains("WARN")
                    && (line.contains("reading again from the database's position")
                        || line.contains("reading them again from the database's position")
                        || line.contains("holds no position for this partition"))
                {
                    self.positions_rewound += 1;
                }
            }
        }
        let parsed = std::fs::read(report)
            .ok()
            .and_then(|b| serde_json::from_slice::<StatsReport>(&b).ok());
        if let Some(r) = parsed {
            self.records_committed += r.stats.records;
            self.duplicates_skipped += r.stats.duplicates;
            self.retries_reported += r.stats.retries;
            self.transactions += r.stats.transactions;
            self.replays_avoided += r.stats.replays_avoided;
            self.offsets_refused += r.stats.offsets_refused;
        }
    }

    /// Failed attempts that were retried.
    pub fn retries(&self) -> u64 {
        self.retries_logged.max(self.retries_reported)
    }
}

/// A stream's position moved back by a processor: to `sequence`, from what its run had
/// `reached` (the records in between are read and committed again, the inbox skipping them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewind {
    /// The stream.
    pub stream: String,
    /// The delivery that came back: the position goes back to it.
    pub sequence: i64,
    /// What the run had reached.
    pub reached: i64,
}

/// The `stream=`, `sequence=` and `reached=` fields of a log line.
fn announced_rewind(line: &str) -> Option<Rewind> {
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(|v| v.trim_matches('"').to_owned())
    };
    Some(Rewind {
        stream: field("stream=")?,
        sequence: field("sequence=")?.parse().ok()?,
        reached: field("reached=")?.parse().ok()?,
    })
}

/// Transactions an incarnation's report says it committed (0 without a report).
pub fn committed_transactions(report: &Path) -> u64 {
    std::fs::read(report)
        .ok()
        .and_then(|b| serde_json::from_slice::<StatsReport>(&b).ok())
        .map_or(0, |r| r.stats.transactions)
}

/// Records processed again after their batch had committed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Replays {
    /// Committed records beyond the records produced (a lower bound).
    pub replayed_records: u64,
    /// Duplicates skipped beyond the producer's own duplicates (a lower bound).
    pub replayed_duplicates: u64,
    /// Duplicates the producer made on purpose.
    pub producer_duplicates: u64,
    /// Records not read again on assignment thanks to offsets stored in the database.
    pub replays_avoided: u64,
    /// How this was measured.
    pub note: String,
}

impl Replays {
    /// From the tally and the model.
    pub fn new(t: &Tally, produced: u64, producer_duplicates: u64) -> Self {
        Self {
            replayed_records: t.records_committed.saturating_sub(produced),
            replayed_duplicates: t.duplicates_skipped.saturating_sub(producer_duplicates),
            producer_duplicates,
            replays_avoided: t.replays_avoided,
            note: "counts summed over every processor process from its report, rewritten every \
                   250 ms; a killed process loses at most its last 250 ms, so these are lower \
                   bounds"
                .to_owned(),
        }
    }

    /// The larger of the two estimates of records processed again.
    pub fn count(&self) -> u64 {
        self.replayed_records.max(self.replayed_duplicates)
    }

    /// Records the faults made the group read again or skip on assignment: replays, plus the
    /// replays avoided by offsets in the database.
    pub fn redeliveries(&self) -> u64 {
        self.count() + self.replays_avoided
    }
}

/// Throughput over the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Throughput {
    /// Records produced.
    pub produced: u64,
    /// Produced records per second (the paced input rate achieved).
    pub produced_per_s: f64,
    /// Seconds from the start to lag 0 after the faults.
    pub drained_after_s: f64,
    /// Records produced per second of that time: the rate at which input was applied, faults
    /// included.
    pub applied_per_s: f64,
}

/// The results file of one chaos run.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    /// PASS or FAIL.
    pub verdict: String,
    /// Every invariant held.
    pub passed: bool,
    /// Seed of the input and of the nemesis.
    pub seed: u64,
    /// A deliberately unsafe configuration, expected to fail.
    pub control: bool,
    /// Extra flags given to every processor.
    pub processor_args: Vec<String>,
    /// UTC start time.
    pub started_at: String,
    /// Fault phase length.
    pub duration_s: f64,
    /// Topic, partitions, processors at the start, paced input rate.
    pub setup: BTreeMap<String, String>,
    /// Faults by kind.
    pub faults: BTreeMap<String, u64>,
    /// Every fault, in order.
    pub fault_events: Vec<FaultEvent>,
    /// The invariants.
    pub invariants: Vec<Invariant>,
    /// Counts from the processors.
    pub processors: Tally,
    /// Records processed again.
    pub replays: Replays,
    /// Retries (failed batch attempts retried).
    pub retries: u64,
    /// Throughput.
    pub throughput: Throughput,
    /// Committed-offset samples.
    pub offsets: Samples,
    /// Final committed offsets and high watermarks (Kafka).
    pub final_lag: Vec<PartitionLag>,
    /// Each queue at the end: published, position, depth (RabbitMQ).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<super::queues::QueueEnd>,
    /// What the publisher confirmed and published again (RabbitMQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publisher: Option<crate::amqp_publish::Published>,
    /// Each stream at the end: messages, position, the consumer's state (NATS).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<super::streams::StreamEnd>,
    /// What the publisher did (NATS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_publisher: Option<super::streams::StreamsPublished>,
    /// The streams' lock holders as the sampler saw them (NATS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeovers: Option<super::streams::Takeovers>,
    /// The model of what the streams held, which the database is checked against (NATS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streams_expected: Option<crate::generate::Expected>,
    /// Processor exits the nemesis did not cause.
    pub unexpected_exits: Vec<UnexpectedExit>,
    /// Where the logs were.
    pub work_dir: PathBuf,
}

impl ChaosReport {
    /// Prints the summary.
    pub fn print(&self) {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!("seed      {}", self.seed);
        println!("faults    {}", faults.join(", "));
        println!(
            "group     {} processes, {} partition moves, {} revokes, {} retries, {} replayed \
             records, {} replays avoided",
            self.processors.processes,
            self.processors.partition_moves,
            self.processors.revokes,
            self.retries,
            self.replays.count(),
            self.replays.replays_avoided
        );
        for i in &self.invariants {
            println!(
                "{:<5} {:<18} {}",
                if i.ok { "ok" } else { "FAIL" },
                i.name,
                i.detail
            );
        }
        println!("{} (seed {})", self.verdict, self.seed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewind_line_names_its_stream_and_sequence() {
        let line = "2026-12-03T15:15:25.0Z  WARN batch_inbox::source::nats: a delivery came back \
                    below what this run reached, not held by it: reading again from it \
                    stream=run-3 sequence=2603 reached=2673";
        let want = Rewind {
            stream: "run-3".to_owned(),
            sequence: 2603,
            reached: 2673,
        };
        assert_eq!(announced_rewind(line), Some(want));
        assert_eq!(announced_rewind("reading again from it stream=run-3"), None);
    }
}

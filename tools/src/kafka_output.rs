//! What Apache Kafka's own tools and logs say, read for the scripts (the `kafka` subcommand; the
//! scripts run the tools and pipe their output in): a group's lag and committed offsets from
//! ConsumerGroupCommand, the topics' end offsets from GetOffsetShell, and the ISR changes in the
//! brokers' logs.
//!
//! Invariant: a group is at lag 0 only when the table lists at least one partition and every one
//! has a lag of exactly `0` (a `-`, no committed offset, is not 0); output without the table
//! is an error, never an empty success.

use std::io::Read;

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// `kafka` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: KafkaCommand,
}

/// `kafka` subcommands; each reads the tool's output (or the logs) on stdin.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum KafkaCommand {
    /// ConsumerGroupCommand --describe: succeed only when every partition has a committed offset
    /// and a lag of 0 (and say so on stderr).
    LagZero {
        /// The group, for the message.
        #[arg(long)]
        group: String,
    },
    /// ConsumerGroupCommand --describe: print the sum of the CURRENT-OFFSET column (the records
    /// the group has committed as applied; 0 without a table).
    Committed,
    /// GetOffsetShell (TOPIC:PARTITION:OFFSET lines): print the sum of the offsets.
    EndOffsets,
    /// The brokers' logs: print one JSON object of the ISR changes ("ISR updated to" lines:
    /// fewer replicas than nodes is a shrink, all of them an expansion).
    Isr {
        /// The cluster's nodes.
        #[arg(long)]
        nodes: usize,
        /// Partitions TopicCommand lists as under-replicated now.
        #[arg(long)]
        under_replicated: u64,
    },
}

/// Runs a `kafka` subcommand.
pub fn run(args: &KafkaArgs) -> Result<()> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .context("reading stdin")?;
    let text = String::from_utf8_lossy(&bytes);
    match &args.command {
        KafkaCommand::LagZero { group } => {
            let partitions = lag_zero(&text)?;
            eprintln!(
                "ConsumerGroupCommand: lag 0 on all {partitions} partitions of group {group}"
            );
        }
        KafkaCommand::Committed => println!("{}", committed(&text)),
        KafkaCommand::EndOffsets => println!("{}", end_offsets(&text)),
        KafkaCommand::Isr {
            nodes,
            under_replicated,
        } => println!(
            "{}",
            serde_json::to_string(&isr(&text, *nodes, *under_replicated))?
        ),
    }
    Ok(())
}

/// The rows of a ConsumerGroupCommand table from its header on: the header's words, and every
/// later row's.
fn table(text: &str, header: impl Fn(&[&str]) -> bool) -> Option<(Vec<&str>, Vec<Vec<&str>>)> {
    let mut rows = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|r| !r.is_empty());
    let head = rows.find(|r| header(r))?;
    Some((head, rows.collect()))
}

/// The partitions of the table when every one is at lag 0; an error otherwise.
pub fn lag_zero(describe: &str) -> Result<usize> {
    let Some((head, rows)) = table(describe, |r| r.contains(&"LAG") && r.contains(&"PARTITION"))
    else {
        bail!("no partition table in the ConsumerGroupCommand output");
    };
    let lag = head.iter().position(|w| *w == "LAG").unwrap_or(0);
    let body: Vec<_> = rows.iter().filter(|r| r.len() > lag).collect();
    let behind = body.iter().filter(|r| r[lag] != "0").count();
    if body.is_empty() || behind > 0 {
        bail!(
            "partitions with lag or without a committed offset: {behind} of {}",
            body.len()
        );
    }
    Ok(body.len())
}

/// The sum of the table's CURRENT-OFFSET column (rows without a number there count 0).
pub fn committed(describe: &str) -> u64 {
    let Some((head, rows)) = table(describe, |r| r.contains(&"CURRENT-OFFSET")) else {
        return 0;
    };
    let at = head
        .iter()
        .position(|w| *w == "CURRENT-OFFSET")
        .unwrap_or(0);
    rows.iter()
        .filter_map(|r| r.get(at)?.parse::<u64>().ok())
        .fold(0, u64::saturating_add)
}

/// The sum of the last `:`-field of every line (GetOffsetShell's offsets).
pub fn end_offsets(shell: &str) -> u64 {
    shell
        .lines()
        .filter_map(|l| l.rsplit(':').next()?.trim().parse::<u64>().ok())
        .fold(0, u64::saturating_add)
}

/// The brokers' account of replication (`isr-chaos-*.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Isr {
    /// The cluster's nodes.
    pub nodes: usize,
    /// ISR changes to fewer replicas than nodes.
    pub isr_shrinks: u64,
    /// ISR changes back to every node.
    pub isr_expansions: u64,
    /// Partitions under-replicated at the end.
    pub under_replicated_partitions_at_end: u64,
}

/// The ISR changes in the brokers' `logs`.
pub fn isr(logs: &str, nodes: usize, under_replicated: u64) -> Isr {
    let mut r = Isr {
        nodes,
        isr_shrinks: 0,
        isr_expansions: 0,
        under_replicated_partitions_at_end: under_replicated,
    };
    for line in logs.lines() {
        let Some((_, after)) = line.split_once("ISR updated to ") else {
            continue;
        };
        let end = after
            .find(|c: char| !(c.is_ascii_digit() || c == ','))
            .unwrap_or(after.len());
        if end == 0 {
            continue;
        }
        if after[..end].split(',').count() < nodes {
            r.isr_shrinks += 1;
        } else {
            r.isr_expansions += 1;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const DESCRIBE: &str = "
Consumer group 'g' has no active members.

GROUP  TOPIC  PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  CONSUMER-ID  HOST  CLIENT-ID
g      t      0          120             120             0    -            -     -
g      t      1          80              80              0    -            -     -
";

    #[test]
    fn a_group_at_its_ends_is_at_lag_zero() {
        assert_eq!(lag_zero(DESCRIBE).unwrap(), 2);
        assert_eq!(committed(DESCRIBE), 200);
    }

    #[test]
    fn lag_or_a_missing_commit_or_no_table_is_an_error() {
        let behind = DESCRIBE.replace("80              0", "80              3");
        let err = lag_zero(&behind).unwrap_err().to_string();
        assert!(err.contains("1 of 2"), "{err}");
        let uncommitted = DESCRIBE.replace("120             120             0", "-  120  -");
        assert!(lag_zero(&uncommitted).is_err());
        assert_eq!(committed(&uncommitted), 80);
        let err = lag_zero("Error: Consumer group 'g' does not exist.")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no partition table"), "{err}");
        let header_only = "GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG\n";
        assert!(lag_zero(header_only).is_err(), "no partition is not lag 0");
        assert_eq!(committed("nothing"), 0);
    }

    #[test]
    fn end_offsets_are_summed() {
        assert_eq!(
            end_offsets("o.order:0:12\no.order:1:30\no.customer:0:8\n"),
            50
        );
        assert_eq!(end_offsets("WARN something\n\n"), 0);
    }

    #[test]
    fn isr_changes_below_the_nodes_are_shrinks() {
        let logs = "\
[2026-12-02] INFO [Partition t-0 broker=1] ISR updated to 1,2 and version updated to 3
[2026-12-02] INFO [Partition t-0 broker=1] ISR updated to 1,2,3 and version updated to 4
[2026-12-02] INFO [Partition t-1 broker=2] ISR updated to 2 (under-min-isr)
[2026-12-02] INFO something else
";
        assert_eq!(
            isr(logs, 3, 1),
            Isr {
                nodes: 3,
                isr_shrinks: 2,
                isr_expansions: 1,
                under_replicated_partitions_at_end: 1
            }
        );
        assert_eq!(
            serde_json::to_string(&isr("", 3, 0)).unwrap(),
            r#"{"nodes":3,"isr_shrinks":0,"isr_expansions":0,"under_replicated_partitions_at_end":0}"#
        );
    }
}

//! `group-protocol-report`: the table of `scripts/group-protocol-compare.sh` (the classic and
//! the KIP-848 consumer group protocol under the same membership changes), from each protocol's
//! members' stats files and the model of its input, written to `OUT/README.md` and printed.
//!
//! Invariant: "read again" is the records all members read less those produced (records read by
//! a second member after their partition moved); the latency columns are the worst member's,
//! over the members that measured any.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::machine::host;

/// `group-protocol-report` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct GroupProtocolArgs {
    /// The run's directory: PROTOCOL-A.json, -B.json, -C.json (the members' stats files) and
    /// PROTOCOL-expected.json (the model) for classic and consumer.
    #[arg(long)]
    pub work: PathBuf,
    /// The results directory (README.md).
    #[arg(long)]
    pub out: PathBuf,
    /// The producer's records/s.
    #[arg(long)]
    pub rate: String,
    /// The producer's seconds.
    #[arg(long)]
    pub seconds: String,
    /// Apache Kafka's version.
    #[arg(long)]
    pub kafka_version: String,
}

/// One protocol's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// classic or consumer.
    pub protocol: String,
    /// Records produced.
    pub produced: u64,
    /// Records read by all members.
    pub read: u64,
    /// The worst member's p99, p99.9 and max latency, ms.
    pub worst_ms: [f64; 3],
}

/// The row of `protocol` from its members' stats files (`run --stats-file`, read by their
/// documented keys) and the records produced.
pub fn row(protocol: &str, members: &[Value], produced: u64) -> Result<Row> {
    let read = members
        .iter()
        .filter_map(|m| m["stats"]["records"].as_u64())
        .sum();
    let measured: Vec<&Value> = members
        .iter()
        .map(|m| &m["e2e_latency_ms"])
        .filter(|l| l["count"].as_u64().is_some_and(|c| c > 0))
        .collect();
    anyhow::ensure!(
        !measured.is_empty(),
        "no member of the {protocol} run measured a latency"
    );
    let worst = |k: &str| {
        measured
            .iter()
            .filter_map(|l| l[k].as_f64())
            .fold(f64::MIN, f64::max)
    };
    Ok(Row {
        protocol: protocol.to_owned(),
        produced,
        read,
        worst_ms: [worst("p99"), worst("p999"), worst("max")],
    })
}

/// The README, dated `date` (`YYYY-MM-DD HH:MM`, UTC).
pub fn readme(rows: &[Row], a: &GroupProtocolArgs, date: &str, cores: u64) -> String {
    let mut s = format!(
        "# Consumer group protocols under membership changes

`scripts/group-protocol-compare.sh`, {date} UTC, one Apache Kafka
{kv} node, PostgreSQL 15 (`synchronous_commit=on`), {cores} cores shared by all. A paced
producer writes {rate} records/s for {secs} s to 8 partitions; member A starts, B joins at 8 s, A
leaves (SIGTERM) at 16 s, C joins at 24 s. Each run's database equals the generator's model.

| protocol | produced | read by the members | read again | worst member's p99 ms | p99.9 ms | max ms |
|---|---:|---:|---:|---:|---:|---:|
",
        kv = a.kafka_version,
        rate = a.rate,
        secs = a.seconds,
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} |\n",
            r.protocol,
            r.produced,
            r.read,
            r.read as i128 - i128::from(r.produced),
            r.worst_ms[0],
            r.worst_ms[1],
            r.worst_ms[2]
        ));
    }
    s.push_str(
        "
Latency is from each record's timestamp (its intended send time) to the COMMIT of its batch;
its tail is the pause the membership changes cost, since records wait while their partition
has no owner. \"read again\": records delivered to a second member after their partition moved
(applied once, skipped by the inbox as duplicates).
",
    );
    s
}

/// The members' stats files of `protocol` in `work` (A, B, C, those that exist).
fn members(work: &Path, protocol: &str) -> Result<Vec<Value>> {
    ["A", "B", "C"]
        .iter()
        .map(|m| work.join(format!("{protocol}-{m}.json")))
        .filter(|p| p.exists())
        .map(|p| {
            let text = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_slice(&text).with_context(|| format!("parsing {}", p.display()))
        })
        .collect()
}

/// Writes README.md and prints it.
pub fn run(a: &GroupProtocolArgs) -> Result<()> {
    let mut rows = Vec::new();
    for protocol in ["classic", "consumer"] {
        let expected =
            crate::verify::read_expected(&a.work.join(format!("{protocol}-expected.json")))?;
        rows.push(row(
            protocol,
            &members(&a.work, protocol)?,
            expected.records,
        )?);
    }
    let text = readme(&rows, a, &host::utc_now_minutes(), host::cores());
    let path = a.out.join("README.md");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn member(records: u64, p99: f64, p999: f64, max: f64) -> Value {
        json!({"stats": {"records": records},
               "e2e_latency_ms": {"count": records, "p50": 1.0, "p99": p99, "p999": p999, "max": max}})
    }

    fn args() -> GroupProtocolArgs {
        GroupProtocolArgs {
            work: PathBuf::new(),
            out: PathBuf::new(),
            rate: "2000".into(),
            seconds: "40".into(),
            kafka_version: "4.4.0".into(),
        }
    }

    #[test]
    fn the_worst_member_s_latency_and_the_records_read_again() {
        let idle = json!({"stats": {"records": 0}, "e2e_latency_ms": {"count": 0, "max": 1e9}});
        let r = row(
            "classic",
            &[
                member(30_000, 900.0, 1000.0, 1100.0),
                idle,
                member(50_100, 2914.3, 3039.2, 3067.9),
            ],
            80_000,
        )
        .unwrap();
        assert_eq!(r.read, 80_100);
        assert_eq!(r.worst_ms, [2914.3, 3039.2, 3067.9]);
        assert!(row("consumer", &[json!({"stats": {"records": 1}})], 1).is_err());
    }

    /// The committed README, rebuilt from the figures of its table.
    #[test]
    fn the_committed_readme_is_rebuilt_byte_for_byte() {
        let committed = include_str!("../../results/group-protocol/README.md");
        let rows: Vec<Row> = committed
            .lines()
            .filter(|l| l.starts_with("| classic") || l.starts_with("| consumer"))
            .map(|l| {
                let c: Vec<&str> = l
                    .trim_matches(|c| c == '|' || c == ' ')
                    .split(" | ")
                    .collect();
                Row {
                    protocol: c[0].into(),
                    produced: c[1].parse().unwrap(),
                    read: c[2].parse().unwrap(),
                    worst_ms: [
                        c[4].parse().unwrap(),
                        c[5].parse().unwrap(),
                        c[6].parse().unwrap(),
                    ],
                }
            })
            .collect();
        assert_eq!(rows.len(), 2);
        let date = "2026-12-01 11:11";
        assert!(committed.contains(date));
        assert_eq!(readme(&rows, &args(), date, 2), committed);
    }
}

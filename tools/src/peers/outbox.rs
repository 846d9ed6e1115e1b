//! `peers outbox-report`: the results of `scripts/peers/outbox.sh` in its OUT directory,
//! `outbox.json` (printed too, on one line) and `outbox.md`, from the script's counts.
//!
//! Invariant: the figures derived here (the duplicates Debezium re-published, the transactions
//! rolled back) come from the counts the script read, by the writer's rule (every ninth
//! transaction rolled back); keys and layout are those of the committed results.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

use super::table::grouped;
use crate::machine::host;

/// `peers outbox-report` flags: the run's settings and counts.
#[derive(Debug, Clone, clap::Args)]
pub struct OutboxArgs {
    /// The results directory.
    #[arg(long)]
    pub out: PathBuf,
    /// The kill schedule's seed.
    #[arg(long)]
    pub seed: u64,
    /// Kill rounds.
    #[arg(long)]
    pub rounds: u64,
    /// Connect's offset.flush.interval.ms.
    #[arg(long)]
    pub flush_ms: u64,
    /// Partitions per topic.
    #[arg(long)]
    pub partitions: u64,
    /// Events committed in service A.
    #[arg(long)]
    pub events: i64,
    /// The writer's transactions (every ninth rolled back).
    #[arg(long)]
    pub transactions: i64,
    /// Records in the topics (their end offsets).
    #[arg(long)]
    pub published: i64,
    /// Rows in service B.
    #[arg(long)]
    pub b_rows: i64,
    /// Inbox rows.
    #[arg(long)]
    pub inbox: i64,
    /// Dead letters.
    #[arg(long)]
    pub dead_letters: i64,
    /// Records a new group's run counted as duplicates.
    #[arg(long)]
    pub replay_duplicates: i64,
    /// Kills of Connect.
    #[arg(long)]
    pub kills_connect: i64,
    /// Kills of the processor.
    #[arg(long)]
    pub kills_processor: i64,
    /// Processor starts.
    #[arg(long)]
    pub processor_starts: i64,
    /// The run's wall time, s.
    #[arg(long)]
    pub wall_s: i64,
    /// Checks that failed.
    #[arg(long)]
    pub failures: u64,
    /// Kafka Connect's version.
    #[arg(long)]
    pub connect_version: String,
    /// Debezium's version.
    #[arg(long)]
    pub debezium_version: String,
    /// The broker.
    #[arg(long)]
    pub broker: String,
    /// The kill schedule: `AFTER_S:KILLED:DOWN_S` words.
    #[arg(long, default_value = "")]
    pub schedule: String,
}

/// The two kill counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Kills {
    /// Of Connect.
    pub connect: i64,
    /// Of the processor.
    pub processor: i64,
}

/// One kill round, as the script drew it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Round {
    /// Seconds before the kill.
    pub after_s: String,
    /// connect, processor or both.
    pub killed: String,
    /// Seconds down.
    pub down_s: String,
}

/// The machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Machine {
    /// Processors.
    pub cores: u64,
    /// Kernel release.
    pub kernel: String,
}

/// `outbox.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[allow(missing_docs)]
pub struct Outbox {
    pub seed: u64,
    pub rounds: u64,
    pub offset_flush_interval_ms: u64,
    pub partitions_per_topic: u64,
    pub events_committed_in_a: i64,
    pub writer_transactions: i64,
    pub rolled_back_transactions: i64,
    pub records_published: i64,
    pub duplicates_published_and_skipped: i64,
    pub rows_in_b: i64,
    pub inbox_rows: i64,
    pub dead_letters: i64,
    pub new_group_duplicates: i64,
    pub kills: Kills,
    pub processor_starts: i64,
    pub schedule: Vec<Round>,
    pub wall_s: i64,
    pub passed: bool,
    pub connect: String,
    pub broker: String,
    pub machine: Machine,
    pub at: String,
}

/// The schedule's words `AFTER_S:KILLED:DOWN_S` (a missing part is empty).
pub fn schedule(words: &str) -> Vec<Round> {
    words
        .split_whitespace()
        .map(|w| {
            let mut parts = w.split(':').map(str::to_owned);
            Round {
                after_s: parts.next().unwrap_or_default(),
                killed: parts.next().unwrap_or_default(),
                down_s: parts.next().unwrap_or_default(),
            }
        })
        .collect()
}

impl Outbox {
    /// The report of `a`, on `machine` at `at` (`YYYY-MM-DD HH:MM`).
    pub fn new(a: &OutboxArgs, machine: Machine, at: &str) -> Self {
        Self {
            seed: a.seed,
            rounds: a.rounds,
            offset_flush_interval_ms: a.flush_ms,
            partitions_per_topic: a.partitions,
            events_committed_in_a: a.events,
            writer_transactions: a.transactions,
            rolled_back_transactions: a.transactions / 9,
            records_published: a.published,
            duplicates_published_and_skipped: a.published - a.inbox,
            rows_in_b: a.b_rows,
            inbox_rows: a.inbox,
            dead_letters: a.dead_letters,
            new_group_duplicates: a.replay_duplicates,
            kills: Kills {
                connect: a.kills_connect,
                processor: a.kills_processor,
            },
            processor_starts: a.processor_starts,
            schedule: schedule(&a.schedule),
            wall_s: a.wall_s,
            passed: a.failures == 0,
            connect: format!(
                "Kafka Connect {}, Debezium PostgreSQL connector {}",
                a.connect_version, a.debezium_version
            ),
            broker: a.broker.clone(),
            machine,
            at: format!("{at} UTC"),
        }
    }

    /// `outbox.md`.
    pub fn markdown(&self) -> String {
        format!(
            "# Outbox → inbox through Debezium, with kills

Written by `scripts/peers/outbox.sh` on {at}: {cores} cores; {broker}; {connect} with its outbox event router; batch-inbox's SQL handler (`examples/sql/outbox_events.sql`, `--id-header id`).

Service A (a PostgreSQL cluster of its own, `wal_level=logical`) wrote events to its `outbox` table in transactions of 1 to 20 events, every ninth transaction rolled back, while Kafka Connect and the processor were killed with SIGKILL {rounds} times (seed {seed}: Connect {kc} times, the processor {kp} times) and started again. Connect's `offset.flush.interval.ms` was {flush}.

| | |
| --- | ---: |
| events committed in A | {events} |
| transactions (rolled back) | {tx} ({rolled}) |
| records Debezium published | {published} |
| of which duplicates re-published after its restarts, skipped by the inbox | {dups} |
| rows in B (each event once, equal to A's row) | {b_rows} |
| inbox rows | {inbox} |
| dead letters | {dead} |
| a new group's run: records counted as duplicates | {replay} |
| processor starts | {starts} |
| wall time | {wall} s |
| check | {check} |

The check: B's rows equal A's committed events one for one (id, aggregate type and id, event type, payload as `jsonb`), none applied twice, none of the rolled-back ones; the inbox holds one row per event; every record in the topics is an applied event or a skipped duplicate; a new consumer group over the same topics applies nothing.
",
            at = self.at,
            cores = self.machine.cores,
            broker = self.broker,
            connect = self.connect,
            rounds = self.rounds,
            seed = self.seed,
            kc = self.kills.connect,
            kp = self.kills.processor,
            flush = self.offset_flush_interval_ms,
            events = grouped(self.events_committed_in_a),
            tx = grouped(self.writer_transactions),
            rolled = grouped(self.rolled_back_transactions),
            published = grouped(self.records_published),
            dups = grouped(self.duplicates_published_and_skipped),
            b_rows = grouped(self.rows_in_b),
            inbox = grouped(self.inbox_rows),
            dead = self.dead_letters,
            replay = grouped(self.new_group_duplicates),
            starts = self.processor_starts,
            wall = self.wall_s,
            check = if self.passed { "passed" } else { "FAILED" },
        )
    }
}

/// `outbox.json` indented by one space, as committed.
pub fn json(report: &Outbox) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    report.serialize(&mut ser)?;
    Ok(out)
}

/// Writes `outbox.json` and `outbox.md` and prints the JSON on one line.
pub fn run(a: &OutboxArgs) -> Result<()> {
    let machine = Machine {
        cores: host::cores(),
        kernel: host::kernel(),
    };
    let report = Outbox::new(a, machine, &host::utc_now_minutes());
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let path = a.out.join("outbox.json");
    std::fs::write(&path, json(&report)?).with_context(|| format!("writing {}", path.display()))?;
    let path = a.out.join("outbox.md");
    std::fs::write(&path, report.markdown())
        .with_context(|| format!("writing {}", path.display()))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_schedule_s_words_become_rounds() {
        let s = schedule("5.08:connect:1.19 2.42:both:1.90");
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[1],
            Round {
                after_s: "2.42".into(),
                killed: "both".into(),
                down_s: "1.90".into()
            }
        );
        assert!(schedule("").is_empty());
    }

    /// The committed outbox.json and outbox.md, rebuilt from the counts the script passes.
    #[test]
    fn the_committed_results_are_rebuilt_byte_for_byte() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/peers");
        let json_text = std::fs::read_to_string(dir.join("outbox.json")).unwrap();
        let md = std::fs::read_to_string(dir.join("outbox.md")).unwrap();
        let v: Value = serde_json::from_str(&json_text).unwrap();
        let i = |k: &str| v[k].as_i64().unwrap();
        let u = |k: &str| v[k].as_u64().unwrap();
        let connect = v["connect"].as_str().unwrap();
        let (c, d) = connect
            .strip_prefix("Kafka Connect ")
            .unwrap()
            .split_once(", Debezium PostgreSQL connector ")
            .unwrap();
        let schedule: Vec<String> = v["schedule"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let f = |k: &str| r[k].as_str().unwrap().to_owned();
                format!("{}:{}:{}", f("after_s"), f("killed"), f("down_s"))
            })
            .collect();
        let args = OutboxArgs {
            out: PathBuf::new(),
            seed: u("seed"),
            rounds: u("rounds"),
            flush_ms: u("offset_flush_interval_ms"),
            partitions: u("partitions_per_topic"),
            events: i("events_committed_in_a"),
            transactions: i("writer_transactions"),
            published: i("records_published"),
            b_rows: i("rows_in_b"),
            inbox: i("inbox_rows"),
            dead_letters: i("dead_letters"),
            replay_duplicates: i("new_group_duplicates"),
            kills_connect: v["kills"]["connect"].as_i64().unwrap(),
            kills_processor: v["kills"]["processor"].as_i64().unwrap(),
            processor_starts: i("processor_starts"),
            wall_s: i("wall_s"),
            failures: u64::from(!v["passed"].as_bool().unwrap()),
            connect_version: c.into(),
            debezium_version: d.into(),
            broker: v["broker"].as_str().unwrap().into(),
            schedule: schedule.join(" "),
        };
        let machine = Machine {
            cores: v["machine"]["cores"].as_u64().unwrap(),
            kernel: v["machine"]["kernel"].as_str().unwrap().into(),
        };
        let at = v["at"].as_str().unwrap().strip_suffix(" UTC").unwrap();
        let report = Outbox::new(&args, machine, at);
        assert_eq!(
            String::from_utf8(json(&report).unwrap()).unwrap(),
            json_text
        );
        assert_eq!(report.markdown(), md);
    }
}

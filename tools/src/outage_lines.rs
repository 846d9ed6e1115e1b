//! `outage-lines`: the log lines of a broker outage (`scripts/outage-lines.sh`): the processor's
//! JSON log from the broker's kill on, its WARN and ERROR lines (and INFO lines about Kafka)
//! counted by message, digits folded to `N`, most frequent first, then the first 60 lines.
//!
//! Invariant: lines before the kill (by their timestamp, to the second) and lines that are not
//! JSON are not counted; equal counts keep the order in which their message first appeared.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::Value;

/// `outage-lines` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct OutageLinesArgs {
    /// The processor's log (`--log-format json`).
    #[arg(long)]
    pub log: PathBuf,
    /// The kill's UTC time, `YYYY-MM-DDTHH:MM:SS`.
    #[arg(long)]
    pub since: String,
    /// Seconds the node was down (for the heading).
    #[arg(long)]
    pub down: String,
}

/// `message` with every run of digits as `N`.
pub fn fold_digits(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut in_digits = false;
    for c in message.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('N');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

fn prefix(s: &str, chars: usize) -> String {
    s.chars().take(chars).collect()
}

/// The counts of `log` (JSON lines) from `since`, as `counts.txt` holds them.
pub fn counts(log: &str, since: &str, down: &str) -> String {
    // (level, target, message) → count, in order of first appearance.
    let mut counts: Vec<((String, String, String), u64)> = Vec::new();
    let mut lines = Vec::new();
    for raw in log.lines() {
        let Ok(e) = serde_json::from_str::<Value>(raw) else {
            continue;
        };
        let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("");
        let (timestamp, level) = (text("timestamp"), text("level"));
        if prefix(timestamp, 19).as_str() < since || !["WARN", "ERROR", "INFO"].contains(&level) {
            continue;
        }
        let message = text("message");
        let folded = prefix(&fold_digits(message), 110);
        if level != "INFO" || folded.contains("Kafka") {
            let key = (level.to_owned(), text("target").to_owned(), folded);
            match counts.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += 1,
                None => counts.push((key, 1)),
            }
            let time: String = timestamp.chars().skip(11).take(8).collect();
            lines.push(format!("{time} {level} {}", prefix(message, 160)));
        }
    }
    let warn: u64 = counts
        .iter()
        .filter(|((level, _, _), _)| level != "INFO")
        .map(|(_, n)| n)
        .sum();
    // Most frequent first; a stable sort keeps the first appearance's order among equals.
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    let mut out =
        format!("WARN/ERROR lines from the kill ({since}Z, {down} s down) to the end: {warn}\n");
    for ((level, target, message), n) in &counts {
        let _ = writeln!(out, "{n:5}  {level:5} {target}: {message}");
    }
    out.push_str("\nThe lines:\n");
    let shown: Vec<&str> = lines.iter().take(60).map(String::as_str).collect();
    let _ = writeln!(out, "{}", shown.join("\n"));
    out
}

/// Prints the counts.
pub fn run(a: &OutageLinesArgs) -> Result<()> {
    let bytes = std::fs::read(&a.log).with_context(|| format!("reading {}", a.log.display()))?;
    print!(
        "{}",
        counts(&String::from_utf8_lossy(&bytes), &a.since, &a.down)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_fold_to_one_n_per_run() {
        assert_eq!(
            fold_digits("127.0.0.1:9092 down for 30s"),
            "N.N.N.N:N down for Ns"
        );
        assert_eq!(fold_digits(""), "");
    }

    #[test]
    fn lines_before_the_kill_and_plain_info_are_not_counted() {
        let log = r#"{"timestamp":"2026-12-02T04:44:07.9Z","level":"WARN","message":"before","target":"t"}
not json
{"timestamp":"2026-12-02T04:44:08.1Z","level":"INFO","message":"batch committed","target":"t"}
{"timestamp":"2026-12-02T04:44:08.2Z","level":"WARN","message":"broker 1 down","target":"t"}
{"timestamp":"2026-12-02T04:44:09.0Z","level":"INFO","message":"Kafka answers again","target":"t"}
{"timestamp":"2026-12-02T04:44:10.0Z","level":"ERROR","message":"x","target":"u"}
{"timestamp":"2026-12-02T04:44:11.0Z","level":"WARN","message":"broker 2 down","target":"t"}
{"timestamp":"2026-12-02T04:44:11.0Z","level":"DEBUG","message":"broker 3 down","target":"t"}
"#;
        let text = counts(log, "2026-12-02T04:44:08", "20");
        assert_eq!(
            text,
            "WARN/ERROR lines from the kill (2026-12-02T04:44:08Z, 20 s down) to the end: 3
    2  WARN  t: broker N down
    1  INFO  t: Kafka answers again
    1  ERROR u: x

The lines:
04:44:08 WARN broker 1 down
04:44:09 INFO Kafka answers again
04:44:10 ERROR x
04:44:11 WARN broker 2 down
"
        );
    }

    /// The committed counts, made again from the committed logs.
    #[test]
    fn the_committed_counts_are_rebuilt_byte_for_byte() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/outage-lines");
        for run in ["before", "after"] {
            let read = |f: &str| std::fs::read_to_string(dir.join(run).join(f)).unwrap();
            let committed = read("counts.txt");
            let heading = committed.lines().next().unwrap();
            let (_, rest) = heading.split_once("kill (").unwrap();
            let (since, rest) = rest.split_once("Z, ").unwrap();
            let down = rest.split_once(" s down").unwrap().0;
            assert_eq!(counts(&read("log.jsonl"), since, down), committed, "{run}");
        }
    }
}

//! RabbitMQ in a chaos run: the queues the processors read, their depth as the broker counts it
//! (`rabbitmqctl list_queues`), and the positions the processors keep in the database
//! (`consumer_offsets`, partition 0 of a "topic" named after each queue), watched while the
//! faults run.
//!
//! Invariants checked here: a queue's position in the database never moves backwards (each
//! batch's transaction moves it forward by its records, compare-and-set); at the end every queue
//! holds no message, ready or unacknowledged; each queue's position covers every record published
//! to it (each was delivered and committed at least once, its copies and redeliveries after a
//! COMMIT counted again), and the positions add up to at least the records the processors report
//! in committed transactions (a committed record that did not move a position would be applied
//! without being counted).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::checker::Invariant;
use super::offsets::Samples;

/// How RabbitMQ is set up for the run.
#[derive(Debug, Clone)]
pub struct Queues {
    /// The broker's URL (it holds a password: never shown).
    pub url: String,
    /// The queues, one per account modulo their number.
    pub names: Vec<String>,
    /// Their type.
    pub kind: batch_inbox::QueueType,
    /// The rabbitmqctl wrapper of the run's node.
    pub ctl: std::path::PathBuf,
}

/// One queue at the end of the run.
#[derive(Debug, Clone, Serialize)]
pub struct QueueEnd {
    /// The queue.
    pub name: String,
    /// Distinct records published to it and confirmed.
    pub published: u64,
    /// The database's position (next position): deliveries committed.
    pub position: Option<i64>,
    /// Messages ready in the broker (`None`: the queue was not listed).
    pub ready: Option<u64>,
    /// Messages delivered and not acknowledged.
    pub unacknowledged: Option<u64>,
}

/// Each queue's `(ready, unacknowledged)` as `rabbitmqctl list_queues` tells it, in the order of
/// `names` (`None`: not listed).
pub fn depths(ctl: &Path, names: &[String]) -> Result<Vec<Option<(u64, u64)>>, String> {
    let out = std::process::Command::new(ctl)
        .args([
            "-q",
            "list_queues",
            "--no-table-headers",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ])
        .output()
        .map_err(|e| format!("{}: {e}", ctl.display()))?;
    if !out.status.success() {
        return Err(format!(
            "rabbitmqctl list_queues: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(parse_depths(&String::from_utf8_lossy(&out.stdout), names))
}

fn parse_depths(text: &str, names: &[String]) -> Vec<Option<(u64, u64)>> {
    let listed: std::collections::HashMap<&str, (u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.split('\t');
            let (name, ready, unacked) = (w.next()?, w.next()?, w.next()?);
            Some((
                name.trim(),
                (ready.trim().parse().ok()?, unacked.trim().parse().ok()?),
            ))
        })
        .collect();
    names
        .iter()
        .map(|n| listed.get(n.as_str()).copied())
        .collect()
}

/// The database's position of each queue (`None`: none stored), in the order of `names`.
pub async fn positions(
    pool: &deadpool_postgres::Pool,
    group: &str,
    names: &[String],
) -> Result<Vec<Option<i64>>, String> {
    let read = async {
        let client = pool.get().await.map_err(|e| e.to_string())?;
        let rows = client
            .query(
                "SELECT topic, next_offset FROM consumer_offsets
                  WHERE group_id = $1 AND partition = 0",
                &[&group],
            )
            .await
            .map_err(|e| e.to_string())?;
        let stored: std::collections::HashMap<String, i64> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        Ok(names.iter().map(|n| stored.get(n).copied()).collect())
    };
    tokio::time::timeout(Duration::from_secs(3), read)
        .await
        .unwrap_or_else(|_| Err("no answer within 3 s".to_owned()))
}

/// Samples the queues' positions every `every` until `stop` is set; times are seconds since
/// `started`. A sample that fails (the database is down) is counted, not compared.
pub fn spawn_sampler(
    pool: deadpool_postgres::Pool,
    group: String,
    names: Vec<String>,
    every: Duration,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Samples> {
    tokio::spawn(async move {
        let mut samples = Samples::default();
        let mut last: Vec<Option<i64>> = vec![None; names.len()];
        while !stop.load(Ordering::Acquire) {
            match positions(&pool, &group, &names).await {
                Ok(now) => {
                    samples.samples += 1;
                    super::offsets::record(
                        &mut samples,
                        &mut last,
                        &now,
                        started.elapsed().as_secs_f64(),
                    );
                }
                Err(_) => samples.failed_samples += 1,
            }
            tokio::time::sleep(every).await;
        }
        samples
    })
}

/// Every queue listed, with nothing ready and nothing unacknowledged.
pub fn queues_empty(ends: &[QueueEnd]) -> Invariant {
    let not: Vec<String> = ends
        .iter()
        .filter(|q| q.ready != Some(0) || q.unacknowledged != Some(0))
        .map(|q| match (q.ready, q.unacknowledged) {
            (Some(r), Some(u)) => format!("{}: {r} ready, {u} unacknowledged", q.name),
            _ => format!("{}: not listed by the broker", q.name),
        })
        .collect();
    let ok = !ends.is_empty() && not.is_empty();
    let detail = if ends.is_empty() {
        "no queue".to_owned()
    } else if ok {
        format!("{} queues, 0 ready and 0 unacknowledged each", ends.len())
    } else {
        format!("not empty: {}", not.join("; "))
    };
    Invariant {
        name: "queues_empty".to_owned(),
        ok,
        detail,
    }
}

/// Each queue's position at least its published records, and the positions' sum at least the
/// records the processors committed (`committed`, a lower bound summed over their reports).
pub fn positions_cover(ends: &[QueueEnd], committed: u64) -> Invariant {
    let short: Vec<String> = ends
        .iter()
        .filter(|q| q.position.unwrap_or(0) < q.published as i64)
        .map(|q| {
            format!(
                "{}: position {:?}, {} records published",
                q.name, q.position, q.published
            )
        })
        .collect();
    let sum: i64 = ends.iter().map(|q| q.position.unwrap_or(0)).sum();
    let published: u64 = ends.iter().map(|q| q.published).sum();
    let ok = !ends.is_empty() && short.is_empty() && sum >= committed as i64;
    let mut detail = format!(
        "positions sum to {sum} for {published} records published ({} delivered again after a \
         COMMIT or published twice); the processors reported {committed} records committed",
        sum - published as i64
    );
    if !short.is_empty() {
        detail.push_str(&format!(
            "; behind what was published (loss, or deliveries applied without moving the \
             position): {}",
            short.join("; ")
        ));
    }
    if sum < committed as i64 {
        detail.push_str(
            "; fewer positions than committed records (records applied without moving a position)",
        );
    }
    Invariant {
        name: "positions_cover".to_owned(),
        ok,
        detail,
    }
}

/// The dead-letter reason of a record that is bad input by itself (no id, an id that is not a
/// UUID, a value that is no ledger entry), as the processor's decoder and the ledger decide it;
/// `None` for a valid record.
pub fn invalid_reason(r: &crate::generate::Record) -> Option<String> {
    use batch_inbox::internals::message::parse_id;
    use batch_inbox::ledger::Entry;
    let reason = match r.id.as_deref().map(|s| parse_id(s.as_bytes())) {
        None => Some(batch_inbox::Reason::MissingId),
        Some(Err((reason, _))) => Some(reason),
        Some(Ok(_)) => Entry::parse(r.value.as_deref())
            .err()
            .map(|(reason, _)| reason),
    };
    reason.map(|r| r.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(
        name: &str,
        published: u64,
        position: Option<i64>,
        depth: Option<(u64, u64)>,
    ) -> QueueEnd {
        QueueEnd {
            name: name.to_owned(),
            published,
            position,
            ready: depth.map(|d| d.0),
            unacknowledged: depth.map(|d| d.1),
        }
    }

    #[test]
    fn list_queues_output_is_read_by_name() {
        let names = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let got = parse_depths("b\t3\t1\na\t0\t0\nnoise line\n", &names);
        assert_eq!(got, vec![Some((0, 0)), Some((3, 1)), None]);
    }

    #[test]
    fn a_queue_with_messages_left_or_missing_fails() {
        assert!(queues_empty(&[end("a", 5, Some(5), Some((0, 0)))]).ok);
        assert!(!queues_empty(&[end("a", 5, Some(5), Some((1, 0)))]).ok);
        assert!(!queues_empty(&[end("a", 5, Some(5), Some((0, 2)))]).ok);
        assert!(!queues_empty(&[end("a", 5, Some(5), None)]).ok);
        assert!(!queues_empty(&[]).ok);
    }

    #[test]
    fn positions_must_cover_the_input_and_the_committed_records() {
        let ends = [end("a", 5, Some(7), None), end("b", 3, Some(3), None)];
        assert!(positions_cover(&ends, 10).ok);
        assert!(
            !positions_cover(&ends, 11).ok,
            "more committed than positions"
        );
        let behind = [end("a", 5, Some(4), None), end("b", 3, Some(9), None)];
        assert!(!positions_cover(&behind, 0).ok, "one queue behind fails");
        assert!(!positions_cover(&[end("a", 1, None, None)], 0).ok);
    }
}

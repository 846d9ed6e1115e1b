//! Stalled partitions: those whose batch failed for the environment's fault (a missing table, a
//! revoked grant, a read-only database) and waits, retried, until an operator fixes the cause;
//! and those whose fetches Kafka refuses (a revoked topic ACL), which librdkafka retries.
//!
//! Invariant: a partition is listed here from its first failed attempt until the attempt that
//! commits, and only then; its gauge `batch_inbox_stalled{topic,partition}` is 1 exactly while it
//! is listed (0 once it resumed), and `/readyz` is 503 while any partition is listed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type PartitionLabels = [(&'static str, String); 2];
type StateLabel = [(&'static str, String); 1];

/// What a stalled partition waits on.
#[derive(Debug, Clone)]
struct Stall {
    sqlstate: String,
    since: Instant,
    /// Stalled by the poison-rate breaker, not by the error's class.
    breaker: bool,
    /// Stalled by Kafka refusing its fetches (what it refused), not by the database.
    kafka: Option<&'static str>,
}

/// The stalled partitions of a processor and their metrics.
#[derive(Debug, Default)]
pub(crate) struct Stalls {
    now: Mutex<BTreeMap<(String, i32), Stall>>,
    gauge: Family<PartitionLabels, Gauge>,
    retries: Family<StateLabel, Counter>,
}

/// A partition's labels; the member-level series (partition -1, a stall of the group member
/// itself, such as refused offset commits) is `partition="member"`.
fn labels(topic: &str, partition: i32) -> PartitionLabels {
    let partition = match partition {
        -1 => "member".to_owned(),
        p => p.to_string(),
    };
    [("topic", topic.to_owned()), ("partition", partition)]
}

impl Stalls {
    /// Records one failed attempt of a stalled partition (`sqlstate`: the error's SQLSTATE, or
    /// `none` for an error without one).
    pub(crate) fn retrying(&self, topic: &str, partition: i32, sqlstate: &str) {
        self.retrying_as(topic, partition, sqlstate, false);
    }

    /// [`Stalls::retrying`] of a partition the poison-rate breaker stalled.
    pub(crate) fn retrying_on_breaker(&self, topic: &str, partition: i32, sqlstate: &str) {
        self.retrying_as(topic, partition, sqlstate, true);
    }

    fn retrying_as(&self, topic: &str, partition: i32, sqlstate: &str, breaker: bool) {
        self.retries
            .get_or_create(&[("sqlstate", sqlstate.to_owned())])
            .inc();
        self.gauge.get_or_create(&labels(topic, partition)).set(1);
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        let entry = now.entry((topic.to_owned(), partition)).or_insert(Stall {
            sqlstate: sqlstate.to_owned(),
            since: Instant::now(),
            breaker,
            kafka: None,
        });
        entry.sqlstate = sqlstate.to_owned();
        entry.breaker = breaker;
        entry.kafka = None;
    }

    /// Kafka refuses the partition's fetches (`what`: `topic authorization failed`); librdkafka
    /// retries them. Listed until [`Stalls::resumed`]: its next record, its end, or its revoke.
    pub(crate) fn kafka_refused(&self, topic: &str, partition: i32, what: &'static str) {
        self.gauge.get_or_create(&labels(topic, partition)).set(1);
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        let entry = now.entry((topic.to_owned(), partition)).or_insert(Stall {
            sqlstate: String::new(),
            since: Instant::now(),
            breaker: false,
            kafka: Some(what),
        });
        entry.kafka = Some(what);
    }

    /// The partition committed again (or was given up: revoked, stopping).
    pub(crate) fn resumed(&self, topic: &str, partition: i32) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        if now.remove(&(topic.to_owned(), partition)).is_some() {
            self.gauge.get_or_create(&labels(topic, partition)).set(0);
        }
    }

    /// Why the process is stalled, if it is: the partitions, the SQLSTATEs and how long.
    pub(crate) fn reason(&self) -> Option<String> {
        let now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        if now.is_empty() {
            return None;
        }
        let parts: Vec<String> = now
            .iter()
            .map(|((t, p), s)| match s.kafka {
                Some(what) if *p == -1 => {
                    format!(
                        "{t} member (Kafka: {what}, {} s)",
                        s.since.elapsed().as_secs()
                    )
                }
                Some(what) => format!("{t}/{p} (Kafka: {what}, {} s)", s.since.elapsed().as_secs()),
                None => format!(
                    "{t}/{p} ({}SQLSTATE {}, {} s)",
                    if s.breaker {
                        "poison-rate breaker, "
                    } else {
                        ""
                    },
                    s.sqlstate,
                    s.since.elapsed().as_secs()
                ),
            })
            .collect();
        let partitions = now.keys().filter(|(_, p)| *p != -1).count();
        let what = match partitions {
            0 => "the group member stalled".to_owned(),
            n => format!("{n} partition(s) stalled"),
        };
        Some(format!(
            "{what}, not the messages' fault: {}",
            parts.join(", ")
        ))
    }

    /// Registers `stalled` and `stall_retries` in `r`.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "stalled",
            "1 while a partition waits on a failure that is not the message's fault (a missing \
             table, a grant, a read-only database; Kafka refusing its fetches): nothing is \
             committed or dead-lettered, the batch is retried until it succeeds; \
             partition=\"member\": Kafka refuses the group's offset commits",
            self.gauge.clone(),
        );
        r.register(
            "stall_retries",
            "Failed attempts of stalled partitions, by SQLSTATE (none: not a database error)",
            self.retries.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(s: &Stalls) -> String {
        let mut r = Registry::with_prefix("batch_inbox");
        s.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encodes");
        text
    }

    #[test]
    fn a_partition_is_stalled_from_its_first_failure_until_it_resumes() {
        let s = Stalls::default();
        assert_eq!(s.reason(), None);
        s.retrying("t", 3, "42P01");
        s.retrying("t", 3, "42501");
        let reason = s.reason().expect("stalled");
        assert!(
            reason.starts_with("1 partition(s) stalled") && reason.contains("t/3 (SQLSTATE 42501"),
            "{reason}"
        );
        let text = encode(&s);
        assert!(
            text.contains("batch_inbox_stalled{topic=\"t\",partition=\"3\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("batch_inbox_stall_retries_total{sqlstate=\"42P01\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("batch_inbox_stall_retries_total{sqlstate=\"42501\"} 1"),
            "{text}"
        );
        s.resumed("t", 3);
        assert_eq!(s.reason(), None);
        assert!(encode(&s).contains("batch_inbox_stalled{topic=\"t\",partition=\"3\"} 0"));
    }

    #[test]
    fn a_partition_whose_fetches_kafka_refuses_is_stalled_until_it_resumes() {
        let s = Stalls::default();
        s.kafka_refused("t", 1, "topic authorization failed");
        let reason = s.reason().expect("stalled");
        assert!(
            reason.contains("t/1 (Kafka: topic authorization failed, 0 s)"),
            "{reason}"
        );
        assert!(encode(&s).contains("batch_inbox_stalled{topic=\"t\",partition=\"1\"} 1"));
        s.resumed("t", 1);
        assert_eq!(s.reason(), None);
        s.kafka_refused("t", -1, "group authorization failed");
        let reason = s.reason().expect("stalled");
        assert!(
            reason.starts_with("the group member stalled, not the messages' fault: t member (Kafka: group authorization failed"),
            "{reason}"
        );
        assert!(encode(&s).contains("batch_inbox_stalled{topic=\"t\",partition=\"member\"} 1"));
        s.resumed("t", -1);
        assert_eq!(s.reason(), None);
    }
}

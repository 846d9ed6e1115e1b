//! Stalled partitions: those whose batch failed for the environment's fault (a missing table, a
//! revoked grant, a read-only database), or that the poison-rate breaker stopped, and wait,
//! retried, until an operator fixes the cause; those whose fetches Kafka refuses (a revoked topic
//! ACL), which librdkafka retries; and those whose database position is before the log's start.
//!
//! Invariant: a partition is listed here from its first failed attempt until the attempt that
//! commits, and only then; its gauge `batch_inbox_stalled{topic,partition,reason}` is 1 exactly
//! while it is listed, on the one series whose `reason` names what it waits on ([`Cause`]), and
//! 0 on every other series of the partition (0 once it resumed); `/readyz` is 503 while any
//! partition is listed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type StalledLabels = [(&'static str, String); 3];
type StateLabel = [(&'static str, String); 1];

/// What a stalled partition waits on; its `reason` label tells an operator which fix applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// The batch failed for the environment's fault (its SQLSTATE's class, or a timeout): fix
    /// the schema, grant, setting or statement.
    Database,
    /// The poison-rate breaker stopped the partition on a message the handler failed on: look
    /// at the handler's deployment and the dead letters it let through.
    Breaker,
    /// Kafka refuses the partition's fetches or the group's commits (what it refused): grant the
    /// processor's principal READ.
    Kafka(&'static str),
    /// The database's position is before the log's start (what was lost): accept the loss with
    /// `positions set`.
    RecordsLost(&'static str),
}

impl Cause {
    /// The `reason` label of the partition's `batch_inbox_stalled` series.
    fn label(self) -> &'static str {
        match self {
            Cause::Database => "database",
            Cause::Breaker => "breaker",
            Cause::Kafka(_) => "kafka",
            Cause::RecordsLost(_) => "records_lost",
        }
    }

    /// What Kafka refused, or what was lost, for the `/readyz` text.
    fn kafka(self) -> Option<&'static str> {
        match self {
            Cause::Kafka(what) | Cause::RecordsLost(what) => Some(what),
            Cause::Database | Cause::Breaker => None,
        }
    }
}

/// What a stalled partition waits on.
#[derive(Debug, Clone)]
struct Stall {
    sqlstate: String,
    since: Instant,
    cause: Cause,
}

/// The stalled partitions of a processor and their metrics.
#[derive(Debug, Default)]
pub(crate) struct Stalls {
    now: Mutex<BTreeMap<(String, i32), Stall>>,
    gauge: Family<StalledLabels, Gauge>,
    retries: Family<StateLabel, Counter>,
}

/// A partition's labels; the member-level series (partition -1, a stall of the group member
/// itself, such as refused offset commits) is `partition="member"`.
fn labels(topic: &str, partition: i32, cause: Cause) -> StalledLabels {
    let partition = match partition {
        -1 => "member".to_owned(),
        p => p.to_string(),
    };
    [
        ("topic", topic.to_owned()),
        ("partition", partition),
        ("reason", cause.label().to_owned()),
    ]
}

impl Stalls {
    /// Records one failed attempt of a stalled partition (`sqlstate`: the error's SQLSTATE, or
    /// `none` for an error without one).
    pub(crate) fn retrying(&self, topic: &str, partition: i32, sqlstate: &str) {
        self.retrying_as(topic, partition, sqlstate, Cause::Database);
    }

    /// [`Stalls::retrying`] of a partition the poison-rate breaker stalled.
    pub(crate) fn retrying_on_breaker(&self, topic: &str, partition: i32, sqlstate: &str) {
        self.retrying_as(topic, partition, sqlstate, Cause::Breaker);
    }

    fn retrying_as(&self, topic: &str, partition: i32, sqlstate: &str, cause: Cause) {
        self.retries
            .get_or_create(&[("sqlstate", sqlstate.to_owned())])
            .inc();
        self.stall(topic, partition, sqlstate, cause);
    }

    /// Kafka refuses the partition's fetches (`what`: `topic authorization failed`); librdkafka
    /// retries them. Listed until [`Stalls::resumed`]: its next record, its end, or its revoke.
    pub(crate) fn kafka_refused(&self, topic: &str, partition: i32, what: &'static str) {
        self.stall(topic, partition, "", Cause::Kafka(what));
    }

    /// The partition's database position is before its log's start (`what`: how that reads):
    /// it is not consumed until an operator accepts the loss. Listed until [`Stalls::resumed`].
    pub(crate) fn records_lost(&self, topic: &str, partition: i32, what: &'static str) {
        self.stall(topic, partition, "", Cause::RecordsLost(what));
    }

    /// Lists the partition as waiting on `cause`: its series of `cause` at 1, the series of the
    /// cause it waited on before (if another) back at 0. A database stall keeps the SQLSTATE.
    fn stall(&self, topic: &str, partition: i32, sqlstate: &str, cause: Cause) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        let entry = now.entry((topic.to_owned(), partition)).or_insert(Stall {
            sqlstate: sqlstate.to_owned(),
            since: Instant::now(),
            cause,
        });
        if entry.cause.label() != cause.label() {
            self.gauge
                .get_or_create(&labels(topic, partition, entry.cause))
                .set(0);
        }
        if cause.kafka().is_none() {
            entry.sqlstate = sqlstate.to_owned();
        }
        entry.cause = cause;
        self.gauge
            .get_or_create(&labels(topic, partition, cause))
            .set(1);
    }

    /// The partition committed again (or was given up: revoked, stopping).
    pub(crate) fn resumed(&self, topic: &str, partition: i32) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(stall) = now.remove(&(topic.to_owned(), partition)) {
            self.gauge
                .get_or_create(&labels(topic, partition, stall.cause))
                .set(0);
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
            .map(|((t, p), s)| match s.cause.kafka() {
                Some(what) if *p == -1 => {
                    format!(
                        "{t} member (Kafka: {what}, {} s)",
                        s.since.elapsed().as_secs()
                    )
                }
                Some(what) => format!("{t}/{p} (Kafka: {what}, {} s)", s.since.elapsed().as_secs()),
                None => format!(
                    "{t}/{p} ({}SQLSTATE {}, {} s)",
                    if s.cause == Cause::Breaker {
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
            "1 while a partition waits on a failure that is not the message's fault, by reason: \
             database (a missing table, a grant, a read-only database, a timeout), breaker (the \
             poison-rate breaker), kafka (Kafka refusing its fetches), records_lost (its \
             database position is before the log's start); nothing is committed or \
             dead-lettered, the batch is retried until it succeeds; 0 once it resumed; \
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

    /// The `batch_inbox_stalled` and `batch_inbox_stall_retries_total` sample lines of `s`.
    fn samples(s: &Stalls) -> Vec<String> {
        let mut r = Registry::with_prefix("batch_inbox");
        s.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encodes");
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn a_partition_is_stalled_from_its_first_failure_until_it_resumes() {
        let s = Stalls::default();
        assert_eq!(s.reason(), None);
        s.retrying("t", 3, "42P01");
        s.retrying("t", 3, "42501");
        let reason = s.reason().expect("stalled");
        assert_eq!(
            reason,
            "1 partition(s) stalled, not the messages' fault: t/3 (SQLSTATE 42501, 0 s)"
        );
        assert_eq!(
            samples(&s),
            [
                "batch_inbox_stall_retries_total{sqlstate=\"42501\"} 1",
                "batch_inbox_stall_retries_total{sqlstate=\"42P01\"} 1",
                "batch_inbox_stalled{topic=\"t\",partition=\"3\",reason=\"database\"} 1",
            ]
        );
        s.resumed("t", 3);
        assert_eq!(s.reason(), None);
        assert!(samples(&s).contains(
            &"batch_inbox_stalled{topic=\"t\",partition=\"3\",reason=\"database\"} 0".to_owned()
        ));
    }

    /// An alert tells a breaker trip from a database failure, and from Kafka's refusals, by the
    /// `reason` label alone; a partition whose cause changes moves its 1 to the new reason.
    #[test]
    fn the_stalled_gauge_names_what_the_partition_waits_on() {
        let s = Stalls::default();
        s.retrying_on_breaker("t", 0, "22012");
        s.retrying("t", 1, "25006");
        s.kafka_refused("t", 2, "topic authorization failed");
        s.records_lost("t", 3, "records lost");
        let gauge = |s: &Stalls| -> Vec<String> {
            samples(s)
                .into_iter()
                .filter(|l| l.starts_with("batch_inbox_stalled{"))
                .collect()
        };
        assert_eq!(
            gauge(&s),
            [
                "batch_inbox_stalled{topic=\"t\",partition=\"0\",reason=\"breaker\"} 1",
                "batch_inbox_stalled{topic=\"t\",partition=\"1\",reason=\"database\"} 1",
                "batch_inbox_stalled{topic=\"t\",partition=\"2\",reason=\"kafka\"} 1",
                "batch_inbox_stalled{topic=\"t\",partition=\"3\",reason=\"records_lost\"} 1",
            ]
        );
        assert_eq!(
            s.reason().expect("stalled"),
            "4 partition(s) stalled, not the messages' fault: t/0 (poison-rate breaker, SQLSTATE \
             22012, 0 s), t/1 (SQLSTATE 25006, 0 s), t/2 (Kafka: topic authorization failed, 0 \
             s), t/3 (Kafka: records lost, 0 s)"
        );
        // The breaker's partition then fails on the database: one series at 1, the new one.
        s.retrying("t", 0, "42P01");
        s.resumed("t", 1);
        s.resumed("t", 2);
        s.resumed("t", 3);
        assert_eq!(
            gauge(&s),
            [
                "batch_inbox_stalled{topic=\"t\",partition=\"0\",reason=\"breaker\"} 0",
                "batch_inbox_stalled{topic=\"t\",partition=\"0\",reason=\"database\"} 1",
                "batch_inbox_stalled{topic=\"t\",partition=\"1\",reason=\"database\"} 0",
                "batch_inbox_stalled{topic=\"t\",partition=\"2\",reason=\"kafka\"} 0",
                "batch_inbox_stalled{topic=\"t\",partition=\"3\",reason=\"records_lost\"} 0",
            ]
        );
        assert_eq!(
            s.reason().expect("stalled"),
            "1 partition(s) stalled, not the messages' fault: t/0 (SQLSTATE 42P01, 0 s)"
        );
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
        assert!(samples(&s).contains(
            &"batch_inbox_stalled{topic=\"t\",partition=\"1\",reason=\"kafka\"} 1".to_owned()
        ));
        s.resumed("t", 1);
        assert_eq!(s.reason(), None);
        s.kafka_refused("t", -1, "group authorization failed");
        let reason = s.reason().expect("stalled");
        assert!(
            reason.starts_with("the group member stalled, not the messages' fault: t member (Kafka: group authorization failed"),
            "{reason}"
        );
        assert!(samples(&s).contains(
            &"batch_inbox_stalled{topic=\"t\",partition=\"member\",reason=\"kafka\"} 1".to_owned()
        ));
        s.resumed("t", -1);
        assert_eq!(s.reason(), None);
    }
}

//! The topic's retention against the inbox's: a copy redelivered from the topic after its id left
//! the inbox cannot be recognised as a duplicate, so the inbox must keep ids at least as long as the
//! topic keeps records (plus the longest expected redelivery delay).
//!
//! How long a topic keeps a record: a compacted topic (a `cleanup.policy` that contains
//! `compact`, alone or with `delete`) keeps the last record of each key forever; otherwise the
//! broker deletes whole closed segments, once the newest record of a segment is older than
//! `retention.ms`, and a segment is rolled (closed) at the latest `segment.ms` after its first
//! record, so a record can stay up to `retention.ms + segment.ms`. That sum is what the inbox
//! retention is compared with.
//!
//! Read with the standard admin API (one DescribeConfigs of the topic, for `cleanup.policy`,
//! `retention.ms` and `segment.ms`), so it works against any Kafka-protocol broker that
//! implements it; a broker that does not answer is not an error.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use crate::error::KafkaClientError;
use crate::source::kafka::consumer::KafkaSettings;

/// How the topic's retention compares with the inbox's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicRetention {
    /// The topic keeps records at most as long as the inbox keeps ids.
    Covered {
        /// The longest the topic keeps a record: `retention.ms + segment.ms` (see the module
        /// documentation; `retention.ms` alone from [`compare`]).
        topic_ms: i64,
    },
    /// The topic keeps records longer (`None`: forever, `retention.ms = -1` or a compacted
    /// `cleanup.policy`).
    Longer {
        /// The longest the topic keeps a record (`retention.ms + segment.ms`), `None` when
        /// unlimited.
        topic_ms: Option<i64>,
    },
    /// The topic's retention could not be read; why.
    Unknown(String),
}

/// Compares a `retention.ms` value alone with the inbox retention. It ignores compaction and
/// segment rolling, which keep records longer, so it can call a topic covered that is not:
/// [`compare_configs`] counts both, and is what [`check`] uses.
pub fn compare(retention_ms: Option<&str>, inbox: Duration) -> TopicRetention {
    match parse_ms("retention.ms", retention_ms) {
        Err(why) => TopicRetention::Unknown(why),
        Ok(ms) if ms < 0 => TopicRetention::Longer { topic_ms: None },
        Ok(ms) => within(ms, inbox),
    }
}

/// Compares how long a topic keeps records, from its `cleanup.policy`, `retention.ms` and
/// `segment.ms` as DescribeConfigs reports them, with the inbox retention: a policy that
/// contains `compact` keeps records forever; otherwise a record can stay up to
/// `retention.ms + segment.ms` (`retention.ms = -1`: forever). A config the broker did not
/// report, or that does not parse, makes the outcome [`TopicRetention::Unknown`].
pub fn compare_configs(
    cleanup_policy: Option<&str>,
    retention_ms: Option<&str>,
    segment_ms: Option<&str>,
    inbox: Duration,
) -> TopicRetention {
    let Some(policy) = cleanup_policy else {
        return TopicRetention::Unknown("the broker did not report cleanup.policy".to_owned());
    };
    if policy
        .split(',')
        .any(|p| p.trim().eq_ignore_ascii_case("compact"))
    {
        return TopicRetention::Longer { topic_ms: None };
    }
    let retention = match parse_ms("retention.ms", retention_ms) {
        Ok(ms) if ms < 0 => return TopicRetention::Longer { topic_ms: None },
        Ok(ms) => ms,
        Err(why) => return TopicRetention::Unknown(why),
    };
    match parse_ms("segment.ms", segment_ms) {
        Ok(segment) if segment >= 0 => within(retention.saturating_add(segment), inbox),
        Ok(segment) => TopicRetention::Unknown(format!("segment.ms is negative: {segment}")),
        Err(why) => TopicRetention::Unknown(why),
    }
}

/// A config value in milliseconds, or why there is none.
fn parse_ms(name: &str, value: Option<&str>) -> Result<i64, String> {
    let text = value.ok_or_else(|| format!("the broker did not report {name}"))?;
    text.trim()
        .parse::<i64>()
        .map_err(|_| format!("{name} is not a number: {text:?}"))
}

/// `topic_ms` (at least 0) against the inbox retention.
fn within(topic_ms: i64, inbox: Duration) -> TopicRetention {
    let inbox_ms = i64::try_from(inbox.as_millis()).unwrap_or(i64::MAX);
    if topic_ms > inbox_ms {
        TopicRetention::Longer {
            topic_ms: Some(topic_ms),
        }
    } else {
        TopicRetention::Covered { topic_ms }
    }
}

/// Reads how long every topic of `kafka` keeps records and compares it with `inbox`: the least
/// safe outcome (a topic that keeps records longer, then one whose retention cannot be read).
pub async fn check(kafka: &KafkaSettings, inbox: Duration) -> TopicRetention {
    let mut worst = None;
    for topic in &kafka.topics {
        worst = Some(less_safe(worst, check_topic(kafka, topic, inbox).await));
    }
    worst.unwrap_or_else(|| TopicRetention::Unknown("no topic to read".to_owned()))
}

/// The less safe of two outcomes (the first when they are alike).
fn less_safe(a: Option<TopicRetention>, b: TopicRetention) -> TopicRetention {
    let rank = |o: &TopicRetention| match o {
        TopicRetention::Longer { .. } => 2,
        TopicRetention::Unknown(_) => 1,
        TopicRetention::Covered { .. } => 0,
    };
    match a {
        Some(a) if rank(&a) >= rank(&b) => a,
        _ => b,
    }
}

/// Reads `topic`'s `cleanup.policy`, `retention.ms` and `segment.ms` (one DescribeConfigs)
/// through `kafka`'s connection and compares them with `inbox` ([`compare_configs`]).
pub async fn check_topic(kafka: &KafkaSettings, topic: &str, inbox: Duration) -> TopicRetention {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.brokers);
    let connection: Vec<(String, String)> = kafka
        .overrides
        .iter()
        .filter(|(k, _)| is_connection_property(k))
        .cloned()
        .collect();
    for (k, v) in &connection {
        config.set(k, v);
    }
    let admin: AdminClient<DefaultClientContext> = match config.create() {
        Ok(a) => a,
        Err(e) => {
            let e = KafkaClientError::new(e, &connection);
            return TopicRetention::Unknown(format!("admin client: {e}"));
        }
    };
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
    let topic = ResourceSpecifier::Topic(topic);
    match admin.describe_configs([&topic], &opts).await {
        Err(e) => TopicRetention::Unknown(format!("DescribeConfigs: {e}")),
        Ok(results) => match results.into_iter().next() {
            Some(Ok(resource)) => {
                let value = |name: &str| resource.get(name).and_then(|e| e.value.as_deref());
                compare_configs(
                    value("cleanup.policy"),
                    value("retention.ms"),
                    value("segment.ms"),
                    inbox,
                )
            }
            Some(Err(code)) => TopicRetention::Unknown(format!("DescribeConfigs: {code:?}")),
            None => TopicRetention::Unknown("DescribeConfigs returned nothing".to_owned()),
        },
    }
}

/// Security and connection properties apply to the admin client too; consumer tuning does not.
fn is_connection_property(key: &str) -> bool {
    [
        "security.",
        "sasl.",
        "ssl.",
        "client.",
        "socket.",
        "broker.",
    ]
    .iter()
    .any(|p| key.starts_with(p))
}

/// Logs a warning for each topic that outlives the inbox retention, at debug level when it cannot
/// tell; returns [`check`]'s outcome.
pub async fn warn_if_topic_outlives(kafka: &KafkaSettings, inbox: Duration) -> TopicRetention {
    let mut worst = None;
    for topic in &kafka.topics {
        let outcome = check_topic(kafka, topic, inbox).await;
        log(topic, &outcome, inbox);
        worst = Some(less_safe(worst, outcome));
    }
    worst.unwrap_or_else(|| TopicRetention::Unknown("no topic to read".to_owned()))
}

fn log(topic: &str, outcome: &TopicRetention, inbox: Duration) {
    let inbox_ms = inbox.as_millis();
    match outcome {
        TopicRetention::Longer { topic_ms } => tracing::warn!(
            topic = %topic,
            "topic retention {} is longer than the inbox retention ({inbox_ms} ms): a \
             copy redelivered after its id expired from the inbox cannot be recognised as a \
             duplicate (UUIDv7 copies are dead-lettered as outside_dedup_window; UUIDv4 copies \
             would be applied again); make the inbox retention at least the topic's retention \
             plus the longest redelivery delay",
            topic_ms.map_or_else(
                || "forever (retention.ms = -1, or a compacted cleanup.policy)".to_owned(),
                |ms| format!("up to {ms} ms (retention.ms + segment.ms)")
            )
        ),
        TopicRetention::Covered { topic_ms } => tracing::debug!(
            topic = %topic, topic_ms, inbox_ms,
            "the topic's retention (retention.ms + segment.ms) is within the inbox retention"
        ),
        TopicRetention::Unknown(why) => tracing::debug!(
            topic = %topic, "cannot read the topic's retention.ms, segment.ms or cleanup.policy: {why}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEEK: Duration = Duration::from_secs(7 * 86_400);
    const DAY_MS: &str = "86400000";
    const HOUR_MS: &str = "3600000";

    fn delete(retention_ms: &str, segment_ms: &str) -> TopicRetention {
        compare_configs(Some("delete"), Some(retention_ms), Some(segment_ms), WEEK)
    }

    #[test]
    fn a_record_can_stay_a_segment_past_retention_ms() {
        // Six days and a day-long segment: seven, the inbox's week exactly.
        assert_eq!(
            delete("518400000", DAY_MS),
            TopicRetention::Covered {
                topic_ms: 604_800_000
            }
        );
        assert_eq!(
            delete("518400000", "86400001"),
            TopicRetention::Longer {
                topic_ms: Some(604_800_001)
            }
        );
        // A week of retention.ms alone is covered only without segments: the broker's default
        // segment.ms (a week) keeps records up to two.
        assert_eq!(
            delete("604800000", "604800000"),
            TopicRetention::Longer {
                topic_ms: Some(1_209_600_000)
            }
        );
        assert_eq!(
            delete(DAY_MS, HOUR_MS),
            TopicRetention::Covered {
                topic_ms: 90_000_000
            }
        );
        assert_eq!(
            delete("-1", HOUR_MS),
            TopicRetention::Longer { topic_ms: None }
        );
        assert_eq!(
            delete("9223372036854775807", HOUR_MS),
            TopicRetention::Longer {
                topic_ms: Some(i64::MAX)
            },
            "saturates"
        );
    }

    #[test]
    fn a_compacted_topic_is_never_covered() {
        for policy in [
            "compact",
            "compact,delete",
            "delete,compact",
            " delete , compact ",
        ] {
            assert_eq!(
                compare_configs(Some(policy), Some(DAY_MS), Some(HOUR_MS), WEEK),
                TopicRetention::Longer { topic_ms: None },
                "{policy}"
            );
        }
        assert_eq!(
            compare_configs(Some("delete"), Some(DAY_MS), Some(HOUR_MS), WEEK),
            TopicRetention::Covered {
                topic_ms: 90_000_000
            }
        );
    }

    #[test]
    fn a_config_missing_or_unreadable_makes_the_outcome_unknown() {
        let unknown = |o: TopicRetention| matches!(o, TopicRetention::Unknown(_));
        let d = Some("delete");
        assert!(unknown(compare_configs(
            None,
            Some(DAY_MS),
            Some(HOUR_MS),
            WEEK
        )));
        assert!(unknown(compare_configs(d, None, Some(HOUR_MS), WEEK)));
        assert!(unknown(compare_configs(d, Some(DAY_MS), None, WEEK)));
        assert!(unknown(compare_configs(d, Some("x"), Some(HOUR_MS), WEEK)));
        assert!(unknown(compare_configs(d, Some(DAY_MS), Some("x"), WEEK)));
        assert!(unknown(compare_configs(d, Some(DAY_MS), Some("-5"), WEEK)));
    }

    #[test]
    fn compare_still_reads_retention_ms_alone() {
        assert_eq!(
            compare(Some("604800000"), WEEK),
            TopicRetention::Covered {
                topic_ms: 604_800_000
            }
        );
        assert_eq!(
            compare(Some("604800001"), WEEK),
            TopicRetention::Longer {
                topic_ms: Some(604_800_001)
            }
        );
        assert_eq!(
            compare(Some("-1"), WEEK),
            TopicRetention::Longer { topic_ms: None }
        );
        assert!(matches!(compare(None, WEEK), TopicRetention::Unknown(_)));
        assert!(matches!(
            compare(Some("x"), WEEK),
            TopicRetention::Unknown(_)
        ));
    }
}

//! The topic's retention against the inbox's: a copy redelivered from the topic after its id left
//! the inbox cannot be recognised as a duplicate, so the inbox must keep ids at least as long as the
//! topic keeps records (plus the longest expected redelivery delay).
//!
//! Read with the standard admin API (DescribeConfigs of `retention.ms`), so it works against any
//! Kafka-protocol broker that implements it; a broker that does not answer is not an error.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use crate::consumer::KafkaSettings;
use crate::error::KafkaClientError;

/// How the topic's retention compares with the inbox's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicRetention {
    /// The topic keeps records at most as long as the inbox keeps ids.
    Covered {
        /// The topic's `retention.ms`.
        topic_ms: i64,
    },
    /// The topic keeps records longer (`None`: forever, `retention.ms = -1`).
    Longer {
        /// The topic's `retention.ms`, `None` when unlimited.
        topic_ms: Option<i64>,
    },
    /// The topic's retention could not be read; why.
    Unknown(String),
}

/// Compares a `retention.ms` value with the inbox retention.
pub fn compare(retention_ms: Option<&str>, inbox: Duration) -> TopicRetention {
    let Some(text) = retention_ms else {
        return TopicRetention::Unknown("the broker did not report retention.ms".to_owned());
    };
    let Ok(ms) = text.trim().parse::<i64>() else {
        return TopicRetention::Unknown(format!("retention.ms is not a number: {text:?}"));
    };
    let inbox_ms = i64::try_from(inbox.as_millis()).unwrap_or(i64::MAX);
    if ms < 0 {
        TopicRetention::Longer { topic_ms: None }
    } else if ms > inbox_ms {
        TopicRetention::Longer { topic_ms: Some(ms) }
    } else {
        TopicRetention::Covered { topic_ms: ms }
    }
}

/// Reads the `retention.ms` of every topic of `kafka` and compares it with `inbox`: the least
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

/// Reads `topic`'s `retention.ms` through `kafka`'s connection and compares it with `inbox`.
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
                let value = resource.get("retention.ms").and_then(|e| e.value.clone());
                compare(value.as_deref(), inbox)
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
            "topic retention.ms {} is longer than the inbox retention ({inbox_ms} ms): a copy \
             redelivered after its id expired from the inbox cannot be recognised as a duplicate \
             (UUIDv7 copies are dead-lettered as outside_dedup_window; UUIDv4 copies would be \
             applied again); make the inbox retention at least the topic's retention plus the \
             longest redelivery delay",
            topic_ms.map_or_else(|| "unlimited (-1)".to_owned(), |ms| ms.to_string())
        ),
        TopicRetention::Covered { topic_ms } => tracing::debug!(
            topic = %topic, topic_ms, inbox_ms, "topic retention is within the inbox retention"
        ),
        TopicRetention::Unknown(why) => tracing::debug!(
            topic = %topic, "cannot read the topic's retention.ms: {why}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_that_keeps_records_longer_than_the_inbox_is_flagged() {
        let week = Duration::from_secs(7 * 86_400);
        assert_eq!(
            compare(Some("604800000"), week),
            TopicRetention::Covered {
                topic_ms: 604_800_000
            }
        );
        assert_eq!(
            compare(Some("604800001"), week),
            TopicRetention::Longer {
                topic_ms: Some(604_800_001)
            }
        );
        assert_eq!(
            compare(Some("-1"), week),
            TopicRetention::Longer { topic_ms: None }
        );
        assert!(matches!(compare(None, week), TopicRetention::Unknown(_)));
        assert!(matches!(
            compare(Some("x"), week),
            TopicRetention::Unknown(_)
        ));
    }
}

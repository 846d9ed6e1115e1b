//! `run --retention` reads how long each topic keeps records from a real broker (Apache Kafka in
//! `scripts/test.sh`) through the standard admin API (`cleanup.policy`, `retention.ms` and
//! `segment.ms`, one DescribeConfigs) and compares it with the inbox retention: a record can stay
//! up to `retention.ms + segment.ms`, and a compacted topic keeps records forever.

use crate::common::broker;
use std::time::Duration;

use batch_inbox::retention::topic::{check, TopicRetention};
use broker::Broker;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

const WEEK: Duration = Duration::from_secs(7 * 86_400);
const HOUR_MS: &str = "3600000";

/// A one-partition topic with these three configs.
fn topic<'a>(name: &'a str, policy: &'a str, retention: &'a str, segment: &'a str) -> NewTopic<'a> {
    NewTopic::new(name, 1, TopicReplication::Fixed(1))
        .set("cleanup.policy", policy)
        .set("retention.ms", retention)
        .set("segment.ms", segment)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_kept_longer_than_the_inbox_is_flagged() {
    let broker = Broker::start();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &broker.addr)
        .create()
        .unwrap();
    let names = [
        "kept-long",
        "kept-short",
        "kept-by-segments",
        "compacted",
        "compacted-and-deleted",
    ]
    .map(|n| broker.topic(n));
    let new = [
        topic(&names[0], "delete", "1209600000", HOUR_MS),
        topic(&names[1], "delete", "86400000", HOUR_MS),
        // Six days of retention.ms, but a segment rolls only after a week.
        topic(&names[2], "delete", "518400000", "604800000"),
        topic(&names[3], "compact", "86400000", HOUR_MS),
        topic(&names[4], "compact,delete", "86400000", HOUR_MS),
    ];
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.create_topics(&new, &opts).await.unwrap() {
        r.unwrap();
    }
    let settings = |topic: &str| {
        batch_inbox::KafkaSettings::new(&broker.addr, topic, Broker::group(topic, "g"))
    };
    let mut outcomes = Vec::new();
    for name in &names {
        outcomes.push(check(&settings(name), WEEK).await);
    }
    assert_eq!(
        outcomes,
        [
            TopicRetention::Longer {
                topic_ms: Some(1_209_600_000 + 3_600_000)
            },
            TopicRetention::Covered {
                topic_ms: 86_400_000 + 3_600_000
            },
            TopicRetention::Longer {
                topic_ms: Some(518_400_000 + 604_800_000)
            },
            TopicRetention::Longer { topic_ms: None },
            TopicRetention::Longer { topic_ms: None },
        ]
    );
}

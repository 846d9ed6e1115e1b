//! `run --retention` reads the topic's `retention.ms` from a real broker (Apache Kafka in
//! `scripts/test.sh`) through the standard admin API and compares it with the inbox retention.

use crate::common::broker;
use std::time::Duration;

use batch_inbox::retention::topic::{check, TopicRetention};
use broker::Broker;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

const WEEK: Duration = Duration::from_secs(7 * 86_400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_kept_longer_than_the_inbox_is_flagged() {
    let broker = Broker::start();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &broker.addr)
        .create()
        .unwrap();
    let (long_name, short_name) = (broker.topic("kept-long"), broker.topic("kept-short"));
    let long =
        NewTopic::new(&long_name, 1, TopicReplication::Fixed(1)).set("retention.ms", "1209600000");
    let short =
        NewTopic::new(&short_name, 1, TopicReplication::Fixed(1)).set("retention.ms", "86400000");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.create_topics([&long, &short], &opts).await.unwrap() {
        r.unwrap();
    }
    let settings = |topic: &str| {
        batch_inbox::KafkaSettings::new(&broker.addr, topic, Broker::group(topic, "g"))
    };
    assert_eq!(
        check(&settings(&long_name), WEEK).await,
        TopicRetention::Longer {
            topic_ms: Some(1_209_600_000)
        }
    );
    assert_eq!(
        check(&settings(&short_name), WEEK).await,
        TopicRetention::Covered {
            topic_ms: 86_400_000
        }
    );
}

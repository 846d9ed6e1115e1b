//! The Kafka client settings of a processor, and the librdkafka configuration they make: the
//! processor's defaults (each with the measurement or invariant behind it), then the user's
//! overrides.

use rdkafka::config::ClientConfig;

use super::refused::{self, RefusedSetting};
use super::startup_error::KafkaStartupError;

/// Kafka client settings of a processor. `Debug` hides the values of sensitive overrides.
#[derive(Clone)]
#[non_exhaustive]
pub struct KafkaSettings {
    /// Bootstrap servers.
    pub brokers: String,
    /// Topics to consume (at least one).
    pub topics: Vec<String>,
    /// Consumer group.
    pub group: String,
    /// Deliver end-of-partition events (needed by `--exit-on-eof`).
    pub partition_eof: bool,
    /// librdkafka properties applied last, overriding the defaults above.
    pub overrides: Vec<(String, String)>,
}

impl KafkaSettings {
    /// Settings for `group` consuming `topic` from `brokers`, with no overrides.
    pub fn new(
        brokers: impl Into<String>,
        topic: impl Into<String>,
        group: impl Into<String>,
    ) -> Self {
        Self::with_topics(brokers, [topic], group)
    }

    /// Settings for `group` consuming every topic of `topics` from `brokers`, with no overrides.
    pub fn with_topics<T: Into<String>>(
        brokers: impl Into<String>,
        topics: impl IntoIterator<Item = T>,
        group: impl Into<String>,
    ) -> Self {
        Self {
            brokers: brokers.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            group: group.into(),
            partition_eof: false,
            overrides: Vec::new(),
        }
    }

    /// Refuses overrides that would break the guarantee (the table of module `consumer::refused`).
    pub fn check(&self, offsets_in_db: bool) -> Result<(), RefusedSetting> {
        refused::check(self, offsets_in_db)
    }

    /// Asks the brokers, with these settings, for what the group member will need (the topic's
    /// metadata and the group's committed offsets) before anything is consumed, for at most
    /// `timeout`: refused credentials, a failed TLS handshake, a topic or group the principal may
    /// not use, or no broker answering, each as one line. Joins no group and commits nothing.
    pub async fn probe(&self, timeout: std::time::Duration) -> Result<(), KafkaStartupError> {
        let settings = self.clone();
        tokio::task::spawn_blocking(move || super::probe::probe(&settings, timeout))
            .await
            .unwrap_or_else(|e| {
                Err(KafkaStartupError::Request {
                    brokers: self.brokers.clone(),
                    detail: format!("the probe's thread failed: {e}"),
                })
            })
    }

    /// The librdkafka configuration: the processor's defaults, then the overrides.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group)
            .set("enable.auto.offset.store", "false")
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("auto.offset.reset", "earliest")
            // Bound the prefetch (librdkafka keeps up to 100,000 records per partition and asks
            // for 50 MB fetches by default): backpressure instead of memory growth on a large
            // backlog. Measured on a 1M backlog: 2 MB fetches halve peak memory at no cost in
            // throughput.
            .set("queued.min.messages", "10000")
            .set("queued.max.messages.kbytes", "8192")
            // Once a partition's local queue reaches those bounds, librdkafka stops fetching it
            // for fetch.queue.backoff.ms, 1 s by default: against Apache Kafka the workers then
            // ran dry for most of each second. Measured on a 1M backlog (one Kafka 4.4 node):
            // consume-only 7.8 s at the default, 1.5 s at 0; the ledger at batch 1000, 10.9 s
            // at the default, 5.7 s at 10 ms, memory unchanged (the bounds still hold).
            .set("fetch.queue.backoff.ms", "10")
            .set("fetch.max.bytes", "2097152")
            // A broker holds an empty fetch this long: it bounds the latency of a record that
            // arrives on an idle partition (Kafka answers early once data is there; some
            // compatible brokers always wait the full time).
            .set("fetch.wait.max.ms", "10")
            .set("max.partition.fetch.bytes", "262144")
            // Per-partition consumer lag for the metrics and the summary log line.
            .set("statistics.interval.ms", "5000")
            .set(
                "enable.partition.eof",
                if self.partition_eof { "true" } else { "false" },
            );
        // The classic protocol's assignor: incremental (cooperative-sticky), so a rebalance moves
        // only the partitions that change owner. The consumer protocol (KIP-848,
        // `-X group.protocol=consumer`) assigns on the broker and is always incremental; librdkafka
        // refuses the property there.
        if !self.consumer_protocol() {
            c.set("partition.assignment.strategy", "cooperative-sticky");
        }
        for (k, v) in &self.overrides {
            c.set(k, v);
        }
        c
    }

    /// Whether the overrides choose the consumer group protocol of KIP-848.
    fn consumer_protocol(&self) -> bool {
        self.overrides
            .iter()
            .rev()
            .find(|(k, _)| k == "group.protocol")
            .is_some_and(|(_, v)| v.trim().eq_ignore_ascii_case("consumer"))
    }
}

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let KafkaSettings {
            brokers,
            topics,
            group,
            partition_eof,
            overrides,
        } = self;
        f.debug_struct("KafkaSettings")
            .field("brokers", brokers)
            .field("topics", topics)
            .field("group", group)
            .field("partition_eof", partition_eof)
            .field("overrides", &crate::secret::RedactedProperties(overrides))
            .finish()
    }
}

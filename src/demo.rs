//! The embedded demo: an in-process Kafka mock cluster, generated input with duplicates, bad
//! input and overdrafts, the real pipeline against PostgreSQL, and a check against the model.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use rdkafka::mocking::MockCluster;

use crate::consumer::KafkaSettings;
use crate::generate::{generate, Expected, GeneratorSettings};
use crate::ledger::Ledger;
use crate::processor::ProcessorConfig;
use crate::stats::StatsSnapshot;
use crate::verify::{differences, observe};

/// What the demo did.
#[derive(Debug)]
pub struct DemoReport {
    /// The model's expectation.
    pub expected: Expected,
    /// The processor's totals.
    pub stats: StatsSnapshot,
    /// Time from start of consumption to the drained, committed topic.
    pub elapsed: Duration,
    /// Differences between the database and the model (empty: correct).
    pub differences: Vec<String>,
}

/// Produces `input` to a fresh mock cluster topic and applies it to `pool`'s database.
pub async fn run(
    pool: Pool,
    input: GeneratorSettings,
    partitions: i32,
    configure: impl FnOnce(KafkaSettings) -> ProcessorConfig,
) -> anyhow::Result<DemoReport> {
    let cluster = MockCluster::new(1)?;
    let brokers = cluster.bootstrap_servers();
    let topic = "ledger";
    cluster.create_topic(topic, partitions, 1)?;

    let (records, expected) = generate(input);
    let producer = crate::produce::producer(&brokers, &[])?;
    crate::produce::send_all(&producer, topic, records).await?;

    let kafka = KafkaSettings {
        brokers,
        topic: topic.to_owned(),
        group: "batch-inbox-demo".to_owned(),
        partition_eof: true,
        overrides: Vec::new(),
    };
    let start = Instant::now();
    let stats = crate::run(
        configure(kafka),
        pool.clone(),
        Arc::new(Ledger),
        std::future::pending(),
    )
    .await?;
    let elapsed = start.elapsed();
    let observed = observe(&**pool.get().await?).await?;
    Ok(DemoReport {
        differences: differences(&observed, &expected),
        expected,
        stats: stats.snapshot(),
        elapsed,
    })
}

//! The embedded demo: an in-process Kafka mock cluster, generated input with duplicates, bad
//! input and overdrafts, the real pipeline against PostgreSQL, and a check against the model.
//!
//! Invariant: the demo writes only to a database it created itself ([`OwnDatabase`]), with a
//! name no one else uses; it never touches a database it was merely pointed at.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use rdkafka::mocking::MockCluster;

use crate::generate::{generate, Expected, GeneratorSettings};
use crate::verify::{differences, observe};
use batch_inbox::ledger::Ledger;
use batch_inbox::KafkaSettings;
use batch_inbox::ProcessorConfig;
use batch_inbox::StatsSnapshot;

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

    let mut kafka = KafkaSettings::new(brokers, topic, "batch-inbox-demo");
    kafka.partition_eof = true;
    let start = Instant::now();
    let stats = batch_inbox::run(
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

/// A database the demo created, with a name of its own (`batch_inbox_demo_<time>_<pid>`).
#[derive(Debug)]
pub struct OwnDatabase {
    /// Its name.
    pub name: String,
    /// Its connection URL.
    pub url: String,
    server_url: String,
}

impl OwnDatabase {
    /// Creates a new, empty database on the server of `server_url` (whose own database is only
    /// used for CREATE DATABASE and DROP DATABASE).
    pub async fn create(server_url: &str) -> anyhow::Result<Self> {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let name = format!("batch_inbox_demo_{secs}_{}", std::process::id());
        let admin = batch_inbox::db::connect(server_url, 1).await?;
        admin
            .get()
            .await?
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await?;
        Ok(Self {
            url: database_url(server_url, &name),
            name,
            server_url: server_url.to_owned(),
        })
    }

    /// Drops the database (and with it everything the demo wrote).
    pub async fn drop_database(self) -> anyhow::Result<()> {
        let admin = batch_inbox::db::connect(&self.server_url, 1).await?;
        admin
            .get()
            .await?
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await?;
        Ok(())
    }
}

/// `server_url` with its database replaced by `name` (a URL, or a `key=value` string).
fn database_url(server_url: &str, name: &str) -> String {
    let Some((scheme, rest)) = server_url.split_once("://") else {
        return format!("{server_url} dbname={name}");
    };
    let query_at = rest.find('?').unwrap_or(rest.len());
    let path_at = rest[..query_at].find('/').unwrap_or(query_at);
    format!(
        "{scheme}://{}/{name}{}",
        &rest[..path_at],
        &rest[query_at..]
    )
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn the_demo_database_replaces_the_servers_database() {
        assert_eq!(
            database_url("postgres://u@h:5432/postgres?sslmode=require", "d"),
            "postgres://u@h:5432/d?sslmode=require"
        );
        assert_eq!(database_url("postgres://u@h", "d"), "postgres://u@h/d");
        assert_eq!(
            database_url("host=h user=u dbname=postgres", "d"),
            "host=h user=u dbname=postgres dbname=d"
        );
    }
}

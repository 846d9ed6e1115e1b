//! One test's world in one expression: a fresh database, a topic of the test's own holding its
//! input, and runs of the processor (the binary, or the library in this process) that read the
//! topic to its end. A test names what it varies (`partitions`, `records`, `generated`, `args`,
//! `env`, where the broker is) and the builder does the rest, with the helpers of this folder:
//! [`fresh_db`], [`Kafka`], [`Broker`], [`RawProducer`], [`Running`].
//!
//! Invariant: a scenario's database (`<prefix><name>`) and topic are its alone (a topic on a
//! broker that outlives the test is named with the process id and a counter), the input is
//! delivered before [`Scenario::build`] returns, and every `run_*` returns only once the
//! processor has exited (at the topic's end, or refused): what a test asserts afterwards is a
//! finished state, never a state still moving. A process started by [`World::spawn`] is the
//! test's to stop or wait for.
//!
//! ```ignore
//! let world = Scenario::new("kafka_ssl").partitions(2).generated(settings).build().await;
//! let out = world.run_binary().await;
//! world.assert_exact().await;
//! ```

use std::time::Duration;

use batch_inbox::{KafkaSettings, ProcessorConfig, StatsSnapshot};
use batch_inbox_tools::generate::{generate, Expected, GeneratorSettings};
use batch_inbox_tools::verify::{differences, observe};
use deadpool_postgres::Pool;

use super::broker::Broker;
use super::child::{Finished, Running};
use super::raw_producer::{RawProducer, RawRecord};
use super::{drain, fresh_core_db, fresh_db, Kafka};

/// Where the scenario's topic lives.
enum Cluster {
    /// The suite's broker ([`Broker::start`]).
    Shared,
    /// An in-process mock cluster of the test's own ([`Kafka`]).
    Mock,
    /// A broker at this address, run by someone else (the secure node's PLAINTEXT listener).
    At(String),
}

/// What the database holds before the run.
#[derive(Clone)]
enum Tables {
    /// The core's tables and the ledger's ([`fresh_db`]).
    Ledger,
    /// The core's tables, then this SQL (a SQL handler's own tables).
    Core(String),
}

/// A test's setup, built by [`Scenario::build`].
pub struct Scenario {
    name: String,
    topic: String,
    exact_topic: bool,
    partitions: i32,
    cluster: Cluster,
    records: Vec<RawRecord>,
    generated: Option<GeneratorSettings>,
    tables: Tables,
    /// `--brokers` of the binary: `None`, the address the input went to; `Some(None)`, none.
    connect: Option<Option<String>>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Scenario {
    /// Database `name`, topic `name` (underscores as dashes) of one partition on the suite's
    /// broker, no input, the ledger's tables.
    pub fn new(name: &str) -> Scenario {
        Scenario {
            name: name.to_owned(),
            topic: name.replace('_', "-"),
            exact_topic: false,
            partitions: 1,
            cluster: Cluster::Shared,
            records: Vec::new(),
            generated: None,
            tables: Tables::Ledger,
            connect: None,
            args: Vec::new(),
            env: vec![("RUST_LOG".to_owned(), "warn".to_owned())],
        }
    }

    /// The topic's name, before the process id and counter that make it the test's own.
    pub fn topic(mut self, name: &str) -> Scenario {
        self.topic = name.to_owned();
        self
    }

    /// The topic's name exactly as given; nothing is created on the broker unless there is input.
    pub fn topic_named(mut self, name: &str) -> Scenario {
        self.topic = name.to_owned();
        self.exact_topic = true;
        self
    }

    pub fn partitions(mut self, partitions: i32) -> Scenario {
        self.partitions = partitions;
        self
    }

    /// The topic on a mock cluster of the test's own, in this process.
    pub fn mock(mut self) -> Scenario {
        self.cluster = Cluster::Mock;
        self
    }

    /// The topic on the broker at `addr` (created and produced to there).
    pub fn on(mut self, addr: &str) -> Scenario {
        self.cluster = Cluster::At(addr.to_owned());
        self
    }

    /// The processor is given `--brokers addr` instead of the address the input went to
    /// (another listener of the same broker, or one that does not answer).
    pub fn connect(mut self, addr: &str) -> Scenario {
        self.connect = Some(Some(addr.to_owned()));
        self
    }

    /// The processor is given no `--brokers`: its arguments name them (a config file).
    pub fn brokers_from_args(mut self) -> Scenario {
        self.connect = Some(None);
        self
    }

    /// Records produced in this order, each to the partition it names.
    pub fn records(mut self, records: impl IntoIterator<Item = RawRecord>) -> Scenario {
        self.records.extend(records);
        self
    }

    /// A ledger entry (id header `id`, key `account`, `{account_id, amount}`) to `partition`.
    pub fn entry(mut self, partition: i32, id: &str, account: i64, amount: i64) -> Scenario {
        self.records.push(RawRecord {
            partition,
            key: Some(account.to_string().into_bytes()),
            value: Some(format!(r#"{{"account_id":{account},"amount":{amount}}}"#).into_bytes()),
            headers: vec![(b"id".to_vec(), Some(id.as_bytes().to_vec()))],
            timestamp_ms: None,
        });
        self
    }

    /// Ledger entries `(partition, id, account, amount)`, as [`Scenario::entry`] says.
    pub fn entries<S: AsRef<str>>(
        self,
        entries: impl IntoIterator<Item = (i32, S, i64, i64)>,
    ) -> Scenario {
        entries
            .into_iter()
            .fold(self, |s, (partition, id, account, amount)| {
                s.entry(partition, id.as_ref(), account, amount)
            })
    }

    /// Generated ledger records after the others, keyed by account; [`World::expected`] is
    /// their model.
    pub fn generated(mut self, settings: GeneratorSettings) -> Scenario {
        self.generated = Some(settings);
        self
    }

    /// The core's tables without the ledger's, then `ddl` if any (a SQL handler's database).
    pub fn core_tables(mut self, ddl: &str) -> Scenario {
        self.tables = Tables::Core(ddl.to_owned());
        self
    }

    /// Flags of every binary run, after `run --brokers --topic --group --exit-on-eof`.
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Scenario {
        self.args.extend(args.iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// An environment variable of every binary run (`RUST_LOG` is `warn` unless set here).
    pub fn env(mut self, key: &str, value: &str) -> Scenario {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Creates the database and the topic and delivers the input.
    pub async fn build(self) -> World {
        let (url, pool) = database(&self.name, &self.tables).await;
        let (broker, kafka, addr, topic) = match &self.cluster {
            Cluster::Mock => {
                let kafka = Kafka::new(&self.topic, self.partitions);
                let addr = kafka.brokers.clone();
                (None, Some(kafka), addr, self.topic.clone())
            }
            Cluster::Shared => {
                let broker = Broker::start();
                let topic = self.unique_topic(|t| broker.topic(t));
                let addr = broker.addr.clone();
                (Some(broker), None, addr, topic)
            }
            Cluster::At(addr) => {
                let topic = self.unique_topic(super::secure_broker::topic);
                (None, None, addr.clone(), topic)
            }
        };
        let has_input = !self.records.is_empty() || self.generated.is_some();
        if kafka.is_none() && (has_input || !self.exact_topic) {
            batch_inbox_tools::produce::ensure_topic(&addr, &topic, self.partitions)
                .await
                .unwrap();
        }
        if !self.records.is_empty() {
            send(&addr, &topic, &self.records);
        }
        let expected = match self.generated {
            Some(settings) => {
                let (records, expected) = generate(settings);
                let producer = batch_inbox_tools::produce::producer(&addr, &[]).unwrap();
                batch_inbox_tools::produce::send_all(&producer, &topic, records)
                    .await
                    .unwrap();
                Some(expected)
            }
            None => None,
        };
        let connect = match self.connect {
            Some(connect) => connect,
            None => Some(addr.clone()),
        };
        World {
            url,
            pool,
            topic,
            addr,
            expected,
            kafka,
            broker,
            tables: self.tables,
            connect,
            args: self.args,
            env: self.env,
        }
    }

    fn unique_topic(&self, unique: impl Fn(&str) -> String) -> String {
        if self.exact_topic {
            self.topic.clone()
        } else {
            unique(&self.topic)
        }
    }

    /// [`Scenario::build`], then [`World::run_binary`].
    pub async fn run_binary(self) -> (World, Finished) {
        let world = self.build().await;
        let out = world.run_binary().await;
        (world, out)
    }
}

/// Sends `records` to `topic` at `addr`, each to its partition, and waits for every delivery.
fn send(addr: &str, topic: &str, records: &[RawRecord]) {
    let mut producer = RawProducer::new(addr, topic);
    for r in records {
        producer.send(r);
    }
    producer.flush();
}

async fn database(name: &str, tables: &Tables) -> (String, Pool) {
    match tables {
        Tables::Ledger => fresh_db(name).await,
        Tables::Core(ddl) => {
            let (url, pool) = fresh_core_db(name).await;
            if !ddl.is_empty() {
                pool.get().await.unwrap().batch_execute(ddl).await.unwrap();
            }
            (url, pool)
        }
    }
}

/// A built scenario: its database, its topic with the input delivered, and what may run on it.
pub struct World {
    pub url: String,
    pub pool: Pool,
    pub topic: String,
    /// Where the topic was created and produced to.
    pub addr: String,
    /// The model of the generated input.
    pub expected: Option<Expected>,
    /// The mock cluster, when the topic is on one.
    pub kafka: Option<Kafka>,
    broker: Option<Broker>,
    tables: Tables,
    connect: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl World {
    /// The consumer group `name` of this topic ([`Broker::group`]).
    pub fn group(&self, name: &str) -> String {
        Broker::group(&self.topic, name)
    }

    /// The mock cluster.
    pub fn kafka(&self) -> &Kafka {
        self.kafka.as_ref().expect("a scenario on a mock cluster")
    }

    /// The suite's broker.
    pub fn broker(&self) -> &Broker {
        self.broker
            .as_ref()
            .expect("a scenario on the suite's broker")
    }

    /// The scenario's database: its URL and a pool.
    pub fn db(&self) -> (String, Pool) {
        (self.url.clone(), self.pool.clone())
    }

    /// More records to the topic, each to its partition, delivered before it returns.
    pub fn produce(&self, records: &[RawRecord]) {
        send(&self.addr, &self.topic, records);
    }

    /// Another fresh database `name` with the same tables, for a run to compare.
    pub async fn database(&self, name: &str) -> (String, Pool) {
        database(name, &self.tables).await
    }

    /// The binary on this database, as group `g`, with the scenario's flags (at most 120 s).
    pub async fn run_binary(&self) -> Finished {
        self.run_binary_on(&self.url, "g", &[]).await
    }

    /// The binary on the database at `url`, as group `group` of this topic, with the
    /// scenario's flags and then `extra`: `run --brokers --topic --group --exit-on-eof`, to its
    /// end (at most 120 s).
    pub async fn run_binary_on(&self, url: &str, group: &str, extra: &[&str]) -> Finished {
        self.spawn_on(url, group, &["--exit-on-eof"], extra, &[])
            .wait(Duration::from_secs(120))
            .await
    }

    /// The binary as [`World::run_binary_on`] says, without `--exit-on-eof`: it runs until
    /// stopped.
    pub fn spawn(&self, group: &str, extra: &[&str]) -> Running {
        self.spawn_with(group, extra, &[])
    }

    /// [`World::spawn`] with `env` besides the scenario's (a failpoint of this run alone).
    pub fn spawn_with(&self, group: &str, extra: &[&str], env: &[(&str, &str)]) -> Running {
        self.spawn_on(&self.url, group, &[], extra, env)
    }

    fn spawn_on(
        &self,
        url: &str,
        group: &str,
        eof: &[&str],
        extra: &[&str],
        more_env: &[(&str, &str)],
    ) -> Running {
        let group = self.group(group);
        let mut args = vec!["run"];
        if let Some(brokers) = &self.connect {
            args.extend(["--brokers", brokers.as_str()]);
        }
        args.extend(["--topic", &self.topic, "--group", &group]);
        args.extend(eof);
        args.extend(self.args.iter().map(String::as_str));
        args.extend(extra);
        let mut env: Vec<(&str, &str)> = vec![("DATABASE_URL", url)];
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        env.extend(more_env);
        Running::spawn(&args, &env)
    }

    /// Settings of the library's consumer for group `group`, reading to the partitions' ends:
    /// the mock cluster's ([`Kafka::settings`]), or else the topic's at its broker as group
    /// [`World::group`].
    pub fn settings(&self, group: &str) -> KafkaSettings {
        match &self.kafka {
            Some(kafka) => kafka.settings(group),
            None => {
                let mut kafka = KafkaSettings::new(&self.addr, &self.topic, self.group(group));
                kafka.partition_eof = true;
                kafka
            }
        }
    }

    /// The processor in this process until the topic is drained ([`drain`]).
    pub async fn run_library(&self, config: ProcessorConfig) -> StatsSnapshot {
        drain(config, &self.pool).await
    }

    /// Inbox rows: messages applied.
    pub async fn applied(&self) -> i64 {
        let c = self.pool.get().await.unwrap();
        c.query_one("SELECT count(*) FROM inbox", &[])
            .await
            .unwrap()
            .get(0)
    }

    /// The database state equals the generator's model: every balance, inbox row and dead
    /// letter.
    pub async fn assert_exact(&self) {
        let expected = self.expected.as_ref().expect("generated input");
        let observed = observe(&**self.pool.get().await.unwrap()).await.unwrap();
        assert_eq!(differences(&observed, expected), Vec::<String>::new());
    }
}

//! The chaos run (`batch-inbox-bench chaos`, driven by `scripts/chaos.sh`): several processor processes
//! in one group apply a paced, generated input (duplicates, bad input, overdrafts) while a seeded
//! nemesis kills, pauses, restarts the database and changes the membership; then the run heals,
//! drains, and checks the invariants against the generator's model.
//!
//! Invariants checked: every balance and their sum equal the model; the inbox holds exactly the
//! valid distinct ids; dead letters by reason equal the model; the group's committed offsets
//! never move backwards; every partition is committed to its end; and the faults hit (kills,
//! pauses, database restarts, partition moves, retries and replays all above zero).
//!
//! On RabbitMQ (`--amqp-url`, module [`queues`]) the processors read one queue per partition
//! with single active consumer (one reads, the others stand by), the input is published with
//! confirms, and the broker's part is checked instead of Kafka's offsets: the queues' positions
//! in the database never move backwards, cover every record published and every record the
//! processors committed, every queue ends with nothing ready or unacknowledged, and standbys
//! took queues over (more than one process applied records).
//!
//! On NATS JetStream (`--nats-url`, module [`streams`]) the processors read one stream per
//! partition through a durable pull consumer, one processor per stream at a time (the stream's
//! advisory lock in the database), the input is published with each publish acknowledged and
//! published again after a server restart, and the database is checked against the model of
//! what the streams hold (read back at the end); the streams' positions in the database never
//! move backwards but to a delivery a processor announced it reads again, and end at each
//! stream's last sequence; no processor saw a gap in a stream's sequences; and every consumer
//! ends with nothing pending or unacknowledged, as JetStream reports it. The verdict
//! and the numbers go to `results/chaos-<timestamp>-seed<seed>-<pid>.json`; [`summary`] makes
//! one table of a directory of them.

pub mod checker;
pub mod members;
pub mod nemesis;
pub mod offsets;
mod plan;
pub mod queues;
pub mod report;
pub mod streams;
pub mod summary;
pub mod topic;

pub use plan::{ChaosArgs, ChaosError};

/// `chaos`: a run (its flags), or `chaos summary DIR`.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ChaosCli {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: Option<ChaosCommand>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub run: Option<ChaosArgs>,
}

/// `chaos` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ChaosCommand {
    /// Print the Markdown table of every chaos run report (chaos-*.json) in a directory, with
    /// the brokers' replication account (isr-chaos-*.json) and the totals.
    Summary(summary::SummaryArgs),
}

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::generate::Record;
use batch_inbox::DbError;
use members::{Cluster, MemberSpec};
use nemesis::{BrokerFaults, Nemesis, NemesisSettings};
use offsets::GroupOffsets;
use plan::GroupProtocol;
use plan::Plan;
use queues::{QueueEnd, Queues};
use report::{ChaosReport, Replays, Tally, Throughput};
use streams::{StreamEnd, Streams, StreamsPublished, Takeovers};

use crate::amqp_publish::Published;

/// Runs the chaos run; the report says PASS or FAIL.
pub async fn run(args: ChaosArgs) -> Result<ChaosReport, ChaosError> {
    let plan = Plan::new(&args)?;
    let amqp = queues_of(&args, &plan)?;
    let nats = streams_of(&args, &plan)?;
    let (kind, names) = match (&amqp, &nats) {
        (Some(q), _) => ("queues", q.names.join(",")),
        (_, Some(s)) => ("streams", s.names().join(",")),
        _ => ("topic", plan.topic.clone()),
    };
    println!(
        "chaos: seed {} | {} s of faults | {} processors | {} records at {}/s | {kind} {names} | \
         logs {}",
        plan.seed,
        args.duration,
        args.processors,
        plan.records.len(),
        args.rate,
        plan.work.display()
    );
    prepare_database(&args.database_url).await?;
    if let Some(s) = &nats {
        streams::create(s).await.map_err(ChaosError::Setup)?;
    } else if args.topic.is_none() && amqp.is_none() {
        crate::produce::ensure_topic(&args.brokers, &plan.topic, args.partitions).await?;
    }
    let broker = Broker {
        amqp: amqp.as_ref(),
        nats: nats.as_ref(),
    };
    let cluster = Arc::new(Mutex::new(start_cluster(&args, &plan, broker)?));
    let run = under_faults(&args, &plan, &cluster, broker).await?;
    let report = check(&args, &plan, &cluster, run, broker).await?;
    write_report(&args, &plan, &report)?;
    report.print();
    Ok(report)
}

/// RabbitMQ's queues of the run, with `--amqp-url`: `--partitions` of them, named after the
/// run.
fn queues_of(args: &ChaosArgs, plan: &Plan) -> Result<Option<Queues>, ChaosError> {
    let Some(url) = &args.amqp_url else {
        return Ok(None);
    };
    let ctl = args.amqp_ctl.clone().ok_or_else(|| {
        ChaosError::Setup("--amqp-url needs --amqp-ctl (the node's rabbitmqctl)".into())
    })?;
    if args.topic.is_some() || args.db_failover_command.is_some() {
        return Err(ChaosError::Setup(
            "--topic and --db-failover-command are Kafka's (not with --amqp-url)".into(),
        ));
    }
    Ok(Some(Queues {
        url: url.clone(),
        names: (0..args.partitions.max(1))
            .map(|i| format!("{}-q{i}", plan.topic))
            .collect(),
        kind: args.queue_type,
        ctl,
    }))
}

/// NATS JetStream's streams of the run, with `--nats-url`: `--partitions` of them, named
/// after the run, read through one consumer named after the group.
fn streams_of(args: &ChaosArgs, plan: &Plan) -> Result<Option<Streams>, ChaosError> {
    let Some(url) = &args.nats_url else {
        return Ok(None);
    };
    if args.topic.is_some() || args.db_failover_command.is_some() {
        return Err(ChaosError::Setup(
            "--topic and --db-failover-command are Kafka's (not with --nats-url)".into(),
        ));
    }
    Ok(Some(Streams {
        url: url.clone(),
        routing: crate::nats_publish::Routing::new(
            &plan.topic,
            None,
            args.partitions.max(1) as usize,
            1,
        ),
        consumer: plan.group.clone(),
        ack_wait: Duration::from_millis(args.nats_ack_wait_ms.max(1000)),
        duplicate_window: Duration::from_millis(args.nats_duplicate_window_ms),
    }))
}

/// The broker of the run: Kafka when neither is given.
#[derive(Clone, Copy)]
struct Broker<'a> {
    amqp: Option<&'a Queues>,
    nats: Option<&'a Streams>,
}

/// What the committed offsets or positions were seen doing.
enum Sampler {
    Kafka(std::thread::JoinHandle<offsets::Samples>),
    Amqp(tokio::task::JoinHandle<offsets::Samples>),
    Nats(tokio::task::JoinHandle<(offsets::Samples, Takeovers)>),
}

impl Sampler {
    async fn join(self) -> Result<(offsets::Samples, Option<Takeovers>), ChaosError> {
        match self {
            Sampler::Kafka(t) => tokio::task::spawn_blocking(move || t.join())
                .await
                .map_err(|e| ChaosError::Setup(e.to_string()))?
                .map(|s| (s, None))
                .map_err(|_| ChaosError::Setup("the offset sampler panicked".into())),
            Sampler::Amqp(t) => t
                .await
                .map(|s| (s, None))
                .map_err(|e| ChaosError::Setup(e.to_string())),
            Sampler::Nats(t) => t
                .await
                .map(|(s, t)| (s, Some(t)))
                .map_err(|e| ChaosError::Setup(e.to_string())),
        }
    }
}

/// What the input's producer or publisher did.
struct Produced {
    /// Records produced: acknowledged by the broker, plus those published again.
    count: u64,
    /// RabbitMQ's publisher.
    amqp: Option<Published>,
    /// JetStream's publisher.
    nats: Option<StreamsPublished>,
}

/// Produces and injects faults while watching the group's offsets (RabbitMQ: the queues'
/// positions in the database), then heals and drains.
async fn under_faults(
    args: &ChaosArgs,
    plan: &Plan,
    cluster: &Arc<Mutex<Cluster>>,
    broker: Broker<'_>,
) -> Result<Finished, ChaosError> {
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let supervisor = spawn_supervisor(cluster.clone(), stop.clone());
    let every = Duration::from_millis(500);
    let (sampler, producer) = match (broker.amqp, broker.nats) {
        (None, Some(s)) => {
            let pool = batch_inbox::db::connect(&args.database_url, 1).await?;
            let sampler =
                streams::spawn_sampler(pool, locks_of(args, s), every, start, stop.clone());
            let producer =
                tokio::spawn(publish_streams(s.clone(), plan.records.clone(), args.rate));
            (Sampler::Nats(sampler), producer)
        }
        (None, None) => {
            let watch =
                GroupOffsets::new(&args.brokers, &plan.group, &plan.topic, args.partitions)?;
            let sampler = offsets::spawn_sampler(watch, every, start, stop.clone());
            let producer = tokio::spawn(produce(
                args.brokers.clone(),
                plan.topic.clone(),
                plan.records.clone(),
                args.rate,
            ));
            (Sampler::Kafka(sampler), producer)
        }
        (Some(q), _) => {
            let pool = batch_inbox::db::connect(&args.database_url, 1).await?;
            let sampler = queues::spawn_sampler(
                pool,
                plan.group.clone(),
                q.names.clone(),
                every,
                start,
                stop.clone(),
            );
            let producer = tokio::spawn(publish(q.clone(), plan.records.clone(), args.rate));
            (Sampler::Amqp(sampler), producer)
        }
    };
    tokio::time::sleep(Duration::from_secs(5.min(args.duration / 5))).await;
    let mut settings = nemesis_settings(args, plan.seed, &plan.group);
    settings.locks = broker.nats.map(|s| locks_of(args, s));
    let events = Nemesis::new(settings, cluster.clone(), start)
        .run(start + Duration::from_secs(args.duration))
        .await
        .map_err(ChaosError::Setup)?;
    let produced = producer
        .await
        .map_err(|e| ChaosError::Setup(e.to_string()))??;
    let phase = Phases {
        start,
        produced: produced.count,
    };
    let (drained_after, final_lag) = match (broker.amqp, &produced.amqp, broker.nats) {
        (Some(q), Some(p), _) => {
            let drained = heal_and_drain_queues(args, plan, cluster, phase, q, p).await?;
            (drained, Vec::new())
        }
        (_, _, Some(s)) => {
            let drained = heal_and_drain_streams(args, cluster, phase, s).await?;
            (drained, Vec::new())
        }
        _ => heal_and_drain(args, plan, cluster, phase).await?,
    };
    stop.store(true, Ordering::Release);
    let _ = supervisor.await;
    let (samples, takeovers) = sampler.join().await?;
    Ok(Finished {
        events,
        samples,
        takeovers,
        final_lag,
        drained_after,
        produced: produced.count,
        published: produced.amqp,
        nats_published: produced.nats,
    })
}

/// The database's view of the streams' locks.
fn locks_of(args: &ChaosArgs, s: &Streams) -> streams::Locks {
    streams::Locks {
        database_url: args.database_url.clone(),
        streams: s.names().to_vec(),
        consumer: s.consumer.clone(),
    }
}

struct Phases {
    start: Instant,
    produced: u64,
}

struct Finished {
    events: Vec<nemesis::FaultEvent>,
    samples: offsets::Samples,
    /// NATS: the streams' lock holders as the sampler saw them.
    takeovers: Option<Takeovers>,
    final_lag: Vec<offsets::PartitionLag>,
    drained_after: Duration,
    produced: u64,
    /// RabbitMQ's publisher: what it confirmed and published twice.
    published: Option<Published>,
    /// JetStream's publisher.
    nats_published: Option<StreamsPublished>,
}

async fn prepare_database(url: &str) -> Result<(), ChaosError> {
    let pool = batch_inbox::db::connect(url, 1).await?;
    batch_inbox::db::migrate(&pool).await?;
    batch_inbox::ledger::migrate(&pool).await?;
    let client = pool.get().await.map_err(DbError::from)?;
    let rows: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM inbox) + (SELECT count(*) FROM balances)
                  + (SELECT count(*) FROM dead_letters)",
            &[],
        )
        .await?
        .get(0);
    if rows > 0 {
        return Err(ChaosError::Setup(format!(
            "the database is not empty ({rows} rows): give the run a fresh database"
        )));
    }
    Ok(())
}

fn start_cluster(args: &ChaosArgs, plan: &Plan, broker: Broker<'_>) -> Result<Cluster, ChaosError> {
    let bin = members::product_bin()?;
    let mut env = vec![("DATABASE_URL".to_owned(), args.database_url.clone())];
    if let Some(s) = broker.nats {
        // The URL goes in the environment, where the process list does not show its password.
        env.push(("BATCH_INBOX_SOURCE".to_owned(), s.url.clone()));
        let mut run: Vec<String> = vec!["run".into()];
        for name in s.names() {
            run.extend(["--stream".into(), name.clone()]);
        }
        run.extend([
            "--consumer".into(),
            s.consumer.clone(),
            "--group".into(),
            plan.group.clone(),
            "--ack-wait".into(),
            format!("{}ms", s.ack_wait.as_millis()),
            "--pool-size".into(),
            args.partitions.max(1).to_string(),
        ]);
        run.extend(args.processor_args.iter().cloned());
        return start_members(args, plan, bin, run, env, true);
    }
    if let Some(q) = broker.amqp {
        // The URL goes in the environment, where the process list does not show its password.
        let sep = if q.url.contains('?') { '&' } else { '?' };
        env.push((
            "BATCH_INBOX_SOURCE".to_owned(),
            format!("{}{sep}heartbeat={}", q.url, args.amqp_heartbeat),
        ));
        let mut run: Vec<String> = vec!["run".into()];
        for name in &q.names {
            run.extend(["--queue".into(), name.clone()]);
        }
        run.extend([
            "--queue-type".into(),
            q.kind.to_string(),
            "--group".into(),
            plan.group.clone(),
            "--pool-size".into(),
            args.partitions.max(1).to_string(),
        ]);
        run.extend(args.processor_args.iter().cloned());
        return start_members(args, plan, bin, run, env, false);
    }
    let mut run: Vec<String> = [
        "run",
        "--brokers",
        &args.brokers,
        "--topic",
        &plan.topic,
        "--group",
        &plan.group,
        "--pool-size",
        &args.partitions.max(1).to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    // The classic protocol takes the session timeout from the member; the consumer protocol
    // (KIP-848) from the broker's group.consumer.session.timeout.ms, and refuses it here.
    let group: Vec<String> = if args.group_protocol == GroupProtocol::Consumer {
        vec!["-X".into(), "group.protocol=consumer".into()]
    } else {
        vec![
            "-X".into(),
            format!("session.timeout.ms={}", args.session_timeout_ms),
            "-X".into(),
            "heartbeat.interval.ms=1000".into(),
        ]
    };
    run.extend(group);
    run.extend(args.processor_args.iter().cloned());
    start_members(args, plan, bin, run, env, false)
}

fn start_members(
    args: &ChaosArgs,
    plan: &Plan,
    bin: std::path::PathBuf,
    run: Vec<String>,
    env: Vec<(String, String)>,
    session_names: bool,
) -> Result<Cluster, ChaosError> {
    let mut cluster = Cluster::new(MemberSpec {
        bin,
        args: run,
        env,
        work: plan.work.clone(),
        session_names,
    });
    for _ in 0..args.processors.max(1) {
        cluster.start_member()?;
    }
    Ok(cluster)
}

fn nemesis_settings(args: &ChaosArgs, seed: u64, group: &str) -> NemesisSettings {
    NemesisSettings {
        seed,
        db_stop: args.db_stop_command.clone(),
        db_start: args.db_start_command.clone(),
        db_failover: args.db_failover_command.clone(),
        group: group.to_owned(),
        broker: args
            .broker_stop_command
            .clone()
            .zip(args.broker_start_command.clone())
            .map(|(stop, start)| BrokerFaults {
                nodes: args.broker_nodes,
                stop,
                start,
            }),
        // On RabbitMQ a pause outlasts three heartbeat intervals (the broker notices a silent
        // client after two to three), so that the broker closes the paused processor's
        // connection and a standby takes its queues over while it is stopped. On NATS it
        // outlasts ack_wait (its deliveries become due again) and a standby's lock poll (1 s).
        session_timeout: match (&args.amqp_url, &args.nats_url) {
            (Some(_), _) => Duration::from_secs(3 * args.amqp_heartbeat.max(1)),
            (_, Some(_)) => Duration::from_millis(args.nats_ack_wait_ms.max(1000) + 1000),
            _ => Duration::from_millis(args.session_timeout_ms),
        },
        max_members: args.processors.max(1) + 2,
        gap: (Duration::from_millis(1500), Duration::from_millis(4000)),
        locks: None,
        pause_ends_sessions: args.pause_ends_sessions,
    }
}

fn spawn_supervisor(
    cluster: Arc<Mutex<Cluster>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Acquire) {
            cluster
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .supervise();
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

async fn produce(
    brokers: String,
    topic: String,
    records: Vec<Record>,
    rate: f64,
) -> Result<Produced, ChaosError> {
    let producer = crate::produce::producer(&brokers, &[])?;
    let sent = crate::produce::send_paced(&producer, &topic, records, Some(rate), |_| {}).await?;
    Ok(Produced {
        count: sent.delivered,
        amqp: None,
        nats: None,
    })
}

/// Publishes the input to the streams, paced, each publish acknowledged, through server
/// restarts. Produced: the publishes acknowledged plus those published again.
async fn publish_streams(
    s: Streams,
    records: Vec<Record>,
    rate: f64,
) -> Result<Produced, ChaosError> {
    let published = streams::publish_paced(&s, &records, rate, Duration::from_secs(120))
        .await
        .map_err(|e| ChaosError::Setup(format!("publishing: {e}")))?;
    if published.failed_attempts > 0 {
        println!(
            "chaos: {} publishing attempts failed; {} records published again",
            published.failed_attempts, published.republished_records
        );
    }
    Ok(Produced {
        count: published.acked + published.republished_records,
        amqp: None,
        nats: Some(published),
    })
}

/// Publishes the input to the queues, paced, with confirms, through broker restarts. Produced:
/// the publishes confirmed plus those published again (at most what the queues received).
async fn publish(q: Queues, records: Vec<Record>, rate: f64) -> Result<Produced, ChaosError> {
    let url = batch_inbox::AmqpUrl::new(q.url.clone());
    let published = crate::amqp_publish::publish_paced(
        &q.url,
        &q.names,
        q.kind,
        records,
        rate,
        Duration::from_secs(120),
        crate::amqp_publish::PACED_IN_FLIGHT,
    )
    .await
    .map_err(|e| ChaosError::Setup(url.scrub(&format!("publishing: {e:#}"))))?;
    if published.reconnects > 0 {
        println!(
            "chaos: the publisher connected again {} times and published {} records again",
            published.reconnects, published.republished_records
        );
    }
    Ok(Produced {
        count: published.confirmed + published.republished_records,
        amqp: Some(published),
        nats: None,
    })
}

/// JetStream's heal and drain: ends the faults' after-effects, waits until every stream's
/// position covers its last sequence and every consumer has nothing pending or unacknowledged,
/// then stops every member gracefully.
async fn heal_and_drain_streams(
    args: &ChaosArgs,
    cluster: &Arc<Mutex<Cluster>>,
    phase: Phases,
    s: &Streams,
) -> Result<Duration, ChaosError> {
    println!(
        "[chaos {:7.1}s] faults over; {} records published; healing and draining",
        phase.start.elapsed().as_secs_f64(),
        phase.produced
    );
    cluster
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .heal(args.processors.max(1))?;
    let pool = batch_inbox::db::connect(&args.database_url, 1).await?;
    let js = streams::connect(s).await.map_err(ChaosError::Setup)?;
    let deadline = Instant::now() + Duration::from_secs(args.drain_timeout);
    while Instant::now() < deadline {
        if let Ok(at) = queues::positions(&pool, &s.consumer, s.names()).await {
            if streams::drained(s, &js, &at).await {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop_drained(phase, cluster).await
}

/// Says when the brokers' queues or streams drained (since `phase` started) and stops every
/// member; returns that time.
async fn stop_drained(
    phase: Phases,
    cluster: &Arc<Mutex<Cluster>>,
) -> Result<Duration, ChaosError> {
    let drained_after = phase.start.elapsed();
    println!(
        "[chaos {:7.1}s] drained; stopping the members",
        drained_after.as_secs_f64()
    );
    let cluster = cluster.clone();
    tokio::task::spawn_blocking(move || {
        cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop_all(Duration::from_secs(30));
    })
    .await
    .map_err(|e| ChaosError::Setup(e.to_string()))?;
    Ok(drained_after)
}

/// JetStream's part of the check: each stream's end, what the streams hold read back, and the
/// model of it.
struct StreamsChecked {
    names: Vec<String>,
    ends: Vec<StreamEnd>,
    contents: Vec<streams::Contents>,
    expected: crate::generate::Expected,
}

async fn check_streams(
    args: &ChaosArgs,
    s: &Streams,
    published: Option<&StreamsPublished>,
) -> Result<StreamsChecked, ChaosError> {
    let pool = batch_inbox::db::connect(&args.database_url, 1).await?;
    let positions = queues::positions(&pool, &s.consumer, s.names())
        .await
        .map_err(ChaosError::Setup)?;
    let js = streams::connect(s).await.map_err(ChaosError::Setup)?;
    let input = published.map(|p| p.per_stream.clone()).unwrap_or_default();
    let ends = streams::ends(s, &js, &input, &positions)
        .await
        .map_err(ChaosError::Setup)?;
    let mut contents = Vec::new();
    for end in &ends {
        contents.push(
            streams::read_back(&js, &end.name, end.last_seq)
                .await
                .map_err(ChaosError::Setup)?,
        );
    }
    let expected = streams::model_of(&contents);
    Ok(StreamsChecked {
        names: s.names().to_vec(),
        ends,
        contents,
        expected,
    })
}

/// RabbitMQ's heal and drain: ends the faults' after-effects, waits until every queue's position
/// covers what was published to it and the broker holds nothing ready or unacknowledged, then
/// stops every member gracefully.
async fn heal_and_drain_queues(
    args: &ChaosArgs,
    plan: &Plan,
    cluster: &Arc<Mutex<Cluster>>,
    phase: Phases,
    q: &Queues,
    published: &Published,
) -> Result<Duration, ChaosError> {
    println!(
        "[chaos {:7.1}s] faults over; {} records published; healing and draining",
        phase.start.elapsed().as_secs_f64(),
        phase.produced
    );
    cluster
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .heal(args.processors.max(1))?;
    let pool = batch_inbox::db::connect(&args.database_url, 1).await?;
    let deadline = Instant::now() + Duration::from_secs(args.drain_timeout);
    while Instant::now() < deadline {
        let covered = queues::positions(&pool, &plan.group, &q.names)
            .await
            .is_ok_and(|p| {
                p.iter()
                    .zip(&published.per_queue)
                    .all(|(at, n)| at.unwrap_or(0) >= *n as i64)
            });
        if covered {
            let (ctl, names) = (q.ctl.clone(), q.names.clone());
            let empty = tokio::task::spawn_blocking(move || queues::depths(&ctl, &names))
                .await
                .map_err(|e| ChaosError::Setup(e.to_string()))?
                .is_ok_and(|d| d.iter().all(|d| *d == Some((0, 0))));
            if empty {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop_drained(phase, cluster).await
}

/// Each queue at the end: what was published to it, its position, and its depth in the broker.
async fn queue_ends(
    args: &ChaosArgs,
    plan: &Plan,
    q: &Queues,
    published: &Published,
) -> Result<Vec<QueueEnd>, ChaosError> {
    let pool = batch_inbox::db::connect(&args.database_url, 1).await?;
    let positions = queues::positions(&pool, &plan.group, &q.names)
        .await
        .map_err(ChaosError::Setup)?;
    let (ctl, names) = (q.ctl.clone(), q.names.clone());
    let depths = tokio::task::spawn_blocking(move || queues::depths(&ctl, &names))
        .await
        .map_err(|e| ChaosError::Setup(e.to_string()))?
        .map_err(ChaosError::Setup)?;
    Ok(q.names
        .iter()
        .enumerate()
        .map(|(i, name)| QueueEnd {
            name: name.clone(),
            published: published.per_queue.get(i).copied().unwrap_or(0),
            position: positions[i],
            ready: depths[i].map(|d| d.0),
            unacknowledged: depths[i].map(|d| d.1),
        })
        .collect())
}

/// Ends the faults' after-effects, waits for lag 0, stops every member gracefully, and returns
/// when the input was drained and the committed offsets after the members left.
async fn heal_and_drain(
    args: &ChaosArgs,
    plan: &Plan,
    cluster: &Arc<Mutex<Cluster>>,
    phase: Phases,
) -> Result<(Duration, Vec<offsets::PartitionLag>), ChaosError> {
    println!(
        "[chaos {:7.1}s] faults over; {} records produced; healing and draining",
        phase.start.elapsed().as_secs_f64(),
        phase.produced
    );
    cluster
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .heal(args.processors.max(1))?;
    let watch = GroupOffsets::new(&args.brokers, &plan.group, &plan.topic, args.partitions)?;
    let deadline = Instant::now() + Duration::from_secs(args.drain_timeout);
    let (watch, _) = tokio::task::spawn_blocking(move || {
        let lag = watch.wait_for_zero_lag(deadline);
        (watch, lag)
    })
    .await
    .map_err(|e| ChaosError::Setup(e.to_string()))?;
    let drained_after = phase.start.elapsed();
    println!(
        "[chaos {:7.1}s] drained; stopping the members",
        drained_after.as_secs_f64()
    );
    let cluster = cluster.clone();
    let lag = tokio::task::spawn_blocking(move || {
        cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop_all(Duration::from_secs(30));
        watch.lag().unwrap_or_default()
    })
    .await
    .map_err(|e| ChaosError::Setup(e.to_string()))?;
    Ok((drained_after, lag))
}

/// The database, the topic and the group's offsets against the model.
async fn state_invariants(
    args: &ChaosArgs,
    plan: &Plan,
    run: &Finished,
    slack: Option<&checker::DeadLetterSlack>,
    nats: Option<&StreamsChecked>,
    rewinds: &[report::Rewind],
) -> Result<Vec<checker::Invariant>, ChaosError> {
    let pool = batch_inbox::db::connect(&args.database_url, 1).await?;
    let client = pool.get().await.map_err(DbError::from)?;
    let valid = checker::valid_ids(&plan.records);
    if let Some(n) = nats {
        // NATS: the model of what the streams hold (each sequence applied once: exact, dead
        // letters included), which must hold the input; the positions, never back but to a
        // delivery a processor announced it reads again.
        let mut invariants = checker::database(&**client, &valid, &n.expected, None).await?;
        invariants.push(streams::streams_hold_input(
            &n.contents,
            &valid,
            &n.expected,
            &plan.expected,
        ));
        invariants.push(streams::positions_monotonic(
            &run.samples,
            &n.names,
            rewinds,
        ));
        return Ok(invariants);
    }
    let mut invariants = checker::database(&**client, &valid, &plan.expected, slack).await?;
    if run.published.is_some() {
        // RabbitMQ: the positions, never back (strict: a compare-and-set in the database has no
        // stale member to forgive); the queues' ends are checked with the tally.
        invariants.push(checker::offsets_monotonic(&run.samples, &[], &[], true));
        return Ok(invariants);
    }
    let (brokers, topic_name, partitions) =
        (args.brokers.clone(), plan.topic.clone(), args.partitions);
    let contents = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        topic::read_all(&brokers, &topic_name, partitions, deadline)
    })
    .await
    .map_err(|e| ChaosError::Setup(e.to_string()))??;
    let inbox = checker::inbox_ids_of(&**client).await?;
    invariants.push(checker::topic_complete(
        &contents,
        &valid,
        &inbox,
        run.produced,
    ));
    let resumes: Vec<f64> = run
        .events
        .iter()
        .filter(|e| e.fault != nemesis::Fault::Failover)
        .filter_map(|e| e.ends_s)
        .collect();
    let failovers: Vec<checker::Failover> = run
        .events
        .iter()
        .filter_map(|e| {
            e.positions.clone().map(|positions| checker::Failover {
                at_s: e.at_s,
                positions,
            })
        })
        .collect();
    invariants.push(checker::offsets_monotonic(
        &run.samples,
        &resumes,
        &failovers,
        args.strict_offsets,
    ));
    invariants.push(checker::lag_zero(&run.final_lag, args.strict_offsets));
    Ok(invariants)
}

/// Counts over every process that ever ran.
fn tally(
    args: &ChaosArgs,
    cluster: &Mutex<Cluster>,
    amqp: bool,
    takeovers: Option<&Takeovers>,
) -> (Tally, Vec<members::UnexpectedExit>) {
    let c = cluster.lock().unwrap_or_else(|p| p.into_inner());
    let mut t = Tally::default();
    for (log, report) in c.files() {
        t.add(log, report);
    }
    t.partition_moves = if let Some(seen) = takeovers {
        // NATS: a stream's lock seen held by another process than before (a kill, a pause
        // whose sessions the database ended, a leave, a database restart).
        seen.takeovers
    } else if amqp {
        // A queue has one active consumer at a time: every process that applied records beyond
        // one held a queue that another held before it or beside it (a takeover after a kill,
        // a pause past the heartbeat, a leave or a broker restart; or queues split between the
        // first processes at the start).
        (c.files()
            .iter()
            .filter(|(_, report)| report::committed_transactions(report) > 0)
            .count() as u64)
            .saturating_sub(1)
    } else {
        t.partition_assignments
            .saturating_sub(args.partitions.max(0) as u64)
    };
    (t, c.unexpected_exits.clone())
}

/// The faults hit: each kind and each effect counted above zero.
fn faults_hit(
    args: &ChaosArgs,
    faults: &BTreeMap<String, u64>,
    tally: &Tally,
    replays: &Replays,
) -> checker::Invariant {
    let count = |k: &str| faults.get(k).copied().unwrap_or(0);
    let mut hit = vec![("kills", count("kill")), ("pauses", count("pause"))];
    if args.db_stop_command.is_some() && args.db_start_command.is_some() {
        hit.push(("database restarts", count("restart_db")));
    }
    if args.broker_stop_command.is_some() {
        hit.push(("broker restarts", count("restart_broker")));
    }
    if args.db_failover_command.is_some() {
        hit.push(("database failovers", count("failover")));
        // The gap the failover opened was noticed and read again (the WARN lines).
        hit.push(("positions rewound", tally.positions_rewound));
    }
    let (moves, replayed) = match (&args.amqp_url, &args.nats_url) {
        (Some(_), _) => (
            "queue takeovers (processes that applied records, beyond one)",
            "replays (done or avoided)",
        ),
        (_, Some(_)) => (
            "stream takeovers (a lock held by another process)",
            "consumers created again past a stopped reader's uncommitted deliveries",
        ),
        _ => ("partition moves", "replays (done or avoided)"),
    };
    // NATS never delivers a stopped reader's messages again: the next run creates the consumer
    // again at the database's position, and that is the effect counted.
    let replayed_count = match args.nats_url {
        Some(_) => tally.consumers_recreated,
        None => replays.redeliveries(),
    };
    hit.extend([
        (moves, tally.partition_moves),
        ("retries", tally.retries()),
        (replayed, replayed_count),
    ]);
    checker::faults_hit(&hit)
}

async fn check(
    args: &ChaosArgs,
    plan: &Plan,
    cluster: &Arc<Mutex<Cluster>>,
    run: Finished,
    broker: Broker<'_>,
) -> Result<ChaosReport, ChaosError> {
    let amqp = broker.amqp;
    let (tally, unexpected_exits) = tally(args, cluster, amqp.is_some(), run.takeovers.as_ref());
    let nats = match broker.nats {
        Some(s) => Some(check_streams(args, s, run.nats_published.as_ref()).await?),
        None => None,
    };
    let mut queue_report = Vec::new();
    let mut slack = None;
    if let (Some(q), Some(p)) = (amqp, &run.published) {
        queue_report = queue_ends(args, plan, q, p).await?;
        let positions: i64 = queue_report.iter().map(|e| e.position.unwrap_or(0)).sum();
        let published: u64 = queue_report.iter().map(|e| e.published).sum();
        slack = Some(checker::DeadLetterSlack {
            bad_input: plan
                .records
                .iter()
                .filter_map(queues::invalid_reason)
                .collect(),
            extra_deliveries: (positions.max(0) as u64).saturating_sub(published),
        });
    }
    let mut invariants = state_invariants(
        args,
        plan,
        &run,
        slack.as_ref(),
        nats.as_ref(),
        &tally.rewinds_announced,
    )
    .await?;
    if amqp.is_some() {
        invariants.push(queues::queues_empty(&queue_report));
        invariants.push(queues::positions_cover(
            &queue_report,
            tally.records_committed,
        ));
    }
    let mut produced = run.produced;
    let mut replays = Replays::new(&tally, run.produced, plan.expected.duplicates);
    if let Some(n) = &nats {
        invariants.push(streams::positions_cover(&n.ends, tally.records_committed));
        invariants.push(streams::consumers_drained(&n.ends));
        invariants.push(streams::no_offset_gaps(&n.contents, tally.offset_gaps));
        // What the streams hold is the input of the processors: each sequence committed once.
        produced = n.ends.iter().map(|e| e.messages).sum();
        replays = Replays::new(&tally, produced, n.expected.duplicates);
        // The server's redeliveries (each consumer's delivery sequence beyond its stream
        // sequence): each was acknowledged again without being applied (below the database's
        // position) or left to the batch that held it.
        replays.replays_avoided = n.ends.iter().filter_map(|e| e.redeliveries).sum();
        replays.note = "replayed: records committed beyond the streams' messages and duplicates \
                        skipped beyond the streams' copies (lower bounds, from the processors' \
                        reports); avoided: the servers' redeliveries (each consumer's delivery \
                        sequence minus its last stream sequence delivered), each acknowledged \
                        again below the database's position or left to the batch that held it"
            .to_owned();
    }
    if let Some(slack) = &slack {
        // On RabbitMQ the positions count every delivery committed exactly: those beyond the
        // input were delivered again (after a COMMIT whose acknowledgement was lost, or a copy
        // of a publish the broker had not confirmed) and went through the inbox's skip. The
        // processors' reports lose a killed process's last 250 ms, and the publisher's count
        // includes republished records that never arrived, so theirs is the weaker bound.
        replays.replayed_records = replays.replayed_records.max(slack.extra_deliveries);
    }
    let faults = nemesis::counts(&run.events);
    invariants.push(faults_hit(args, &faults, &tally, &replays));
    let passed = invariants.iter().all(|i| i.ok);
    let secs = run.drained_after.as_secs_f64().max(1e-9);
    let (stream_ends, nats_expected) = match nats {
        Some(n) => (n.ends, Some(n.expected)),
        None => (Vec::new(), None),
    };
    Ok(ChaosReport {
        verdict: if passed { "PASS" } else { "FAIL" }.to_owned(),
        passed,
        seed: plan.seed,
        control: args.control,
        processor_args: args.processor_args.clone(),
        started_at: plan.started_at.clone(),
        duration_s: args.duration as f64,
        setup: setup_map(args, plan),
        faults,
        fault_events: run.events,
        invariants,
        retries: tally.retries(),
        processors: tally,
        replays,
        throughput: Throughput {
            produced,
            produced_per_s: produced as f64 / (args.duration as f64 * 0.8).max(1e-9),
            drained_after_s: secs,
            applied_per_s: produced as f64 / secs,
        },
        offsets: run.samples,
        final_lag: run.final_lag,
        queues: queue_report,
        publisher: run.published,
        streams: stream_ends,
        nats_publisher: run.nats_published,
        takeovers: run.takeovers,
        streams_expected: nats_expected,
        unexpected_exits,
        work_dir: plan.work.clone(),
    })
}

fn setup_map(args: &ChaosArgs, plan: &Plan) -> BTreeMap<String, String> {
    if args.nats_url.is_some() {
        return [
            (
                "streams",
                format!("{}-0..{}", plan.topic, args.partitions.max(1) - 1),
            ),
            ("consumer", plan.group.clone()),
            ("group", plan.group.clone()),
            ("partitions", args.partitions.to_string()),
            ("processors", args.processors.to_string()),
            ("rate", args.rate.to_string()),
            ("accounts", args.accounts.to_string()),
            ("records", plan.records.len().to_string()),
            ("ack_wait_ms", args.nats_ack_wait_ms.max(1000).to_string()),
            (
                "duplicate_window_ms",
                args.nats_duplicate_window_ms.to_string(),
            ),
            ("group_protocol", "one-reader-per-stream".to_owned()),
            ("pause_ends_sessions", args.pause_ends_sessions.to_string()),
            ("broker", args.broker_label.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    }
    if args.amqp_url.is_some() {
        return [
            (
                "queues",
                format!("{}-q0..q{}", plan.topic, args.partitions.max(1) - 1),
            ),
            ("group", plan.group.clone()),
            ("partitions", args.partitions.to_string()),
            ("processors", args.processors.to_string()),
            ("rate", args.rate.to_string()),
            ("accounts", args.accounts.to_string()),
            ("records", plan.records.len().to_string()),
            ("queue_type", args.queue_type.to_string()),
            ("amqp_heartbeat_s", args.amqp_heartbeat.to_string()),
            ("group_protocol", "single-active-consumer".to_owned()),
            ("broker", args.broker_label.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    }
    [
        ("topic", plan.topic.clone()),
        ("group", plan.group.clone()),
        ("partitions", args.partitions.to_string()),
        ("processors", args.processors.to_string()),
        ("rate", args.rate.to_string()),
        ("accounts", args.accounts.to_string()),
        ("records", plan.records.len().to_string()),
        ("session_timeout_ms", args.session_timeout_ms.to_string()),
        (
            "group_protocol",
            format!("{:?}", args.group_protocol).to_lowercase(),
        ),
        ("brokers", args.brokers.clone()),
        ("broker", args.broker_label.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

fn write_report(args: &ChaosArgs, plan: &Plan, report: &ChaosReport) -> Result<(), ChaosError> {
    std::fs::create_dir_all(&args.results_dir)?;
    let name = if args.control {
        format!("chaos-control-{}.json", plan.stamp)
    } else {
        format!("chaos-{}.json", plan.stamp)
    };
    let path = args.results_dir.join(name);
    batch_inbox::internals::stats_file::write_atomically(&path, report)?;
    println!("results   {}", path.display());
    Ok(())
}

//! The chaos run (`batch-inbox chaos`, driven by `scripts/chaos.sh`): several processor processes
//! in one group apply a paced, generated input (duplicates, bad input, overdrafts) while a seeded
//! nemesis kills, pauses, restarts the database and changes the membership; then the run heals,
//! drains, and checks the invariants against the generator's model.
//!
//! Invariants checked: every balance and their sum equal the model; the inbox holds exactly the
//! valid distinct ids; dead letters by reason equal the model; the group's committed offsets
//! never move backwards; every partition is committed to its end; and the faults hit (kills,
//! pauses, database restarts, partition moves, retries and replays all above zero). The verdict
//! and the numbers go to `results/chaos-<timestamp>.json`.

pub mod checker;
pub mod members;
pub mod nemesis;
pub mod offsets;
pub mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::DbError;
use crate::generate::{generate, Expected, GeneratorSettings, KeyDistribution, Record};
use members::{Cluster, MemberSpec};
use nemesis::{Nemesis, NemesisSettings};
use offsets::GroupOffsets;
use report::{ChaosReport, Replays, Tally, Throughput};

/// `chaos` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// PostgreSQL database for the run: empty, on a server the run may restart.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// Bootstrap servers of any Kafka-protocol broker.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// Length of the fault phase, in seconds (then the run heals and drains).
    #[arg(long, default_value_t = 120)]
    pub duration: u64,
    /// Seed of the input and of every fault choice; random (and printed) when absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Processor processes at the start.
    #[arg(long, default_value_t = 3)]
    pub processors: usize,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Input records per second while producing (the first 80% of the fault phase).
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Number of accounts of the input.
    #[arg(long, default_value_t = 100)]
    pub accounts: u64,
    /// Shell command that stops the database like a crash; with --db-start-command, enables
    /// database restarts.
    #[arg(long)]
    pub db_stop_command: Option<String>,
    /// Shell command that starts the database again.
    #[arg(long)]
    pub db_start_command: Option<String>,
    /// Extra flag for every processor (repeatable), e.g. an unsafe switch for the control run.
    #[arg(long = "processor-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub processor_args: Vec<String>,
    /// Marks the run as the control (a deliberately unsafe configuration) in the results.
    #[arg(long)]
    pub control: bool,
    /// The processors' session timeout in ms; pauses last longer than this.
    #[arg(long, default_value_t = 6000)]
    pub session_timeout_ms: u64,
    /// Longest wait for the group to drain after the faults, in seconds.
    #[arg(long, default_value_t = 180)]
    pub drain_timeout: u64,
    /// Directory of the results file.
    #[arg(long, default_value = "results")]
    pub results_dir: PathBuf,
    /// Directory for the processors' logs and reports (a temporary one when absent).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

/// Failure of the chaos run itself (not an invariant violation).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// Kafka client failure.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Database setup failure.
    #[error("database: {0}")]
    Db(#[from] DbError),
    /// A statement failed.
    #[error("database: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// Files or processes.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Anything else that stops the run.
    #[error("{0}")]
    Setup(String),
}

/// What the run is about: names, input and model.
struct Plan {
    seed: u64,
    topic: String,
    group: String,
    work: PathBuf,
    records: Vec<Record>,
    expected: Expected,
    started_at: String,
    stamp: String,
}

impl Plan {
    fn new(args: &ChaosArgs) -> Result<Self, ChaosError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| ChaosError::Setup(e.to_string()))?;
        let seed = args.seed.unwrap_or(now.as_nanos() as u64 % 1_000_000_007);
        let stamp = utc_stamp(now.as_secs());
        let work = match &args.work_dir {
            Some(w) => w.clone(),
            None => std::env::temp_dir().join(format!("batch-inbox-chaos-{seed}-{stamp}")),
        };
        std::fs::create_dir_all(&work)?;
        let producing = args.duration as f64 * 0.8;
        let (records, expected) = generate(GeneratorSettings {
            messages: (args.rate * producing) as u64,
            accounts: args.accounts,
            duplicate_ratio: 0.1,
            bad_ratio: 0.01,
            debit_ratio: 0.4,
            id_version: 4,
            seed,
            keys: KeyDistribution::Uniform,
        });
        Ok(Self {
            seed,
            topic: format!("chaos-{seed}-{stamp}"),
            group: format!("chaos-{seed}-{stamp}"),
            work,
            records,
            expected,
            started_at: stamp.clone(),
            stamp,
        })
    }
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the epoch (UTC).
fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Runs the chaos run; the report says PASS or FAIL.
pub async fn run(args: ChaosArgs) -> Result<ChaosReport, ChaosError> {
    let plan = Plan::new(&args)?;
    println!(
        "chaos: seed {} | {} s of faults | {} processors | {} records at {}/s | topic {} | logs {}",
        plan.seed,
        args.duration,
        args.processors,
        plan.records.len(),
        args.rate,
        plan.topic,
        plan.work.display()
    );
    prepare_database(&args.database_url).await?;
    crate::produce::ensure_topic(&args.brokers, &plan.topic, args.partitions).await?;
    let start = Instant::now();
    let cluster = Arc::new(Mutex::new(start_cluster(&args, &plan)?));
    let stop = Arc::new(AtomicBool::new(false));
    let supervisor = spawn_supervisor(cluster.clone(), stop.clone());
    let watch = GroupOffsets::new(&args.brokers, &plan.group, &plan.topic, args.partitions)?;
    let sampler = offsets::spawn_sampler(watch, Duration::from_millis(500), stop.clone());
    let producer = tokio::spawn(produce(
        args.brokers.clone(),
        plan.topic.clone(),
        plan.records.clone(),
        args.rate,
    ));
    tokio::time::sleep(Duration::from_secs(5.min(args.duration / 5))).await;
    let events = Nemesis::new(nemesis_settings(&args, plan.seed), cluster.clone(), start)
        .run(start + Duration::from_secs(args.duration))
        .await
        .map_err(ChaosError::Setup)?;
    let produced = producer
        .await
        .map_err(|e| ChaosError::Setup(e.to_string()))??;
    let phase = Phases { start, produced };
    let (drained_after, final_lag) = heal_and_drain(&args, &plan, &cluster, phase).await?;
    stop.store(true, Ordering::Release);
    let _ = supervisor.await;
    let samples = tokio::task::spawn_blocking(move || sampler.join())
        .await
        .map_err(|e| ChaosError::Setup(e.to_string()))?
        .map_err(|_| ChaosError::Setup("the offset sampler panicked".into()))?;
    let run = Finished {
        events,
        samples,
        final_lag,
        drained_after,
        produced,
    };
    let report = check(&args, &plan, &cluster, run).await?;
    write_report(&args, &plan, &report)?;
    report.print();
    Ok(report)
}

struct Phases {
    start: Instant,
    produced: u64,
}

struct Finished {
    events: Vec<nemesis::FaultEvent>,
    samples: offsets::Samples,
    final_lag: Vec<offsets::PartitionLag>,
    drained_after: Duration,
    produced: u64,
}

async fn prepare_database(url: &str) -> Result<(), ChaosError> {
    let pool = crate::db::connect(url, 1).await?;
    crate::db::migrate(&pool).await?;
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

fn start_cluster(args: &ChaosArgs, plan: &Plan) -> Result<Cluster, ChaosError> {
    let bin = std::env::current_exe()?;
    let mut run: Vec<String> = [
        "run",
        "--database-url",
        &args.database_url,
        "--brokers",
        &args.brokers,
        "--topic",
        &plan.topic,
        "--group",
        &plan.group,
        "--pool-size",
        &args.partitions.max(1).to_string(),
        // tansu answers some fetches at a partition's end with an error; librdkafka then waits
        // fetch.error.backoff.ms (500 ms by default) before fetching that partition again.
        "-X",
        "fetch.error.backoff.ms=10",
        "-X",
        &format!("session.timeout.ms={}", args.session_timeout_ms),
        "-X",
        "heartbeat.interval.ms=1000",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    run.extend(args.processor_args.iter().cloned());
    let mut cluster = Cluster::new(MemberSpec {
        bin,
        args: run,
        work: plan.work.clone(),
    });
    for _ in 0..args.processors.max(1) {
        cluster.start_member()?;
    }
    Ok(cluster)
}

fn nemesis_settings(args: &ChaosArgs, seed: u64) -> NemesisSettings {
    NemesisSettings {
        seed,
        db_stop: args.db_stop_command.clone(),
        db_start: args.db_start_command.clone(),
        session_timeout: Duration::from_millis(args.session_timeout_ms),
        max_members: args.processors.max(1) + 2,
        gap: (Duration::from_millis(1500), Duration::from_millis(4000)),
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
) -> Result<u64, ChaosError> {
    let producer = crate::produce::producer(&brokers, &[])?;
    let sent = crate::produce::send_paced(&producer, &topic, records, Some(rate), |_| {}).await?;
    Ok(sent)
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

async fn check(
    args: &ChaosArgs,
    plan: &Plan,
    cluster: &Arc<Mutex<Cluster>>,
    run: Finished,
) -> Result<ChaosReport, ChaosError> {
    let pool = crate::db::connect(&args.database_url, 1).await?;
    let client = pool.get().await.map_err(DbError::from)?;
    let valid = checker::valid_ids(&plan.records);
    let mut invariants = checker::database(&**client, &valid, &plan.expected).await?;
    invariants.push(checker::offsets_monotonic(&run.samples));
    invariants.push(checker::lag_zero(&run.final_lag));
    let (tally, unexpected_exits) = {
        let c = cluster.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = Tally::default();
        for (log, report) in c.files() {
            t.add(log, report);
        }
        (t, c.unexpected_exits.clone())
    };
    let mut tally = tally;
    tally.partition_moves = tally
        .partition_assignments
        .saturating_sub(args.partitions.max(0) as u64);
    let replays = Replays::new(&tally, run.produced, plan.expected.duplicates);
    let faults = nemesis::counts(&run.events);
    let count = |k: &str| faults.get(k).copied().unwrap_or(0);
    let mut hit = vec![("kills", count("kill")), ("pauses", count("pause"))];
    if args.db_stop_command.is_some() && args.db_start_command.is_some() {
        hit.push(("database restarts", count("restart_db")));
    }
    hit.extend([
        ("partition moves", tally.partition_moves),
        ("retries", tally.retries()),
        ("replays", replays.count()),
    ]);
    invariants.push(checker::faults_hit(&hit));
    let passed = invariants.iter().all(|i| i.ok);
    let secs = run.drained_after.as_secs_f64().max(1e-9);
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
            produced: run.produced,
            produced_per_s: run.produced as f64 / (args.duration as f64 * 0.8).max(1e-9),
            drained_after_s: secs,
            applied_per_s: run.produced as f64 / secs,
        },
        offsets: run.samples,
        final_lag: run.final_lag,
        unexpected_exits,
        work_dir: plan.work.clone(),
    })
}

fn setup_map(args: &ChaosArgs, plan: &Plan) -> BTreeMap<String, String> {
    [
        ("topic", plan.topic.clone()),
        ("group", plan.group.clone()),
        ("partitions", args.partitions.to_string()),
        ("processors", args.processors.to_string()),
        ("rate", args.rate.to_string()),
        ("accounts", args.accounts.to_string()),
        ("records", plan.records.len().to_string()),
        ("session_timeout_ms", args.session_timeout_ms.to_string()),
        ("brokers", args.brokers.clone()),
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
    crate::progress::write_atomically(&path, report)?;
    println!("results   {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_796_017_392), "20261130T054312Z");
    }
}

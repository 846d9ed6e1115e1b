//! Crashes at exact instants: the processor binary, built with failpoints, aborts (like
//! `kill -9`) before COMMIT, between COMMIT and the offset store, after the offset store and
//! after a Kafka offset commit; a restart then reaches the model's exact state. A control run in
//! a deliberately unsafe configuration under the same faults must be reported as wrong, or the
//! check proves nothing (the controls need the `unsafe-controls` feature too).
//!
//! No timing is assumed: the crashing run gets the first half of the input and runs until its
//! failpoint fires (it has no `--exit-on-eof`), and the second half is produced only after the
//! crash, so the crash always lands with input left to process, however fast the machine.

use crate::common;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use batch_inbox::StatsSnapshot;
use batch_inbox_tools::generate::{generate, Expected, GeneratorSettings, Record};
use batch_inbox_tools::verify::{differences, observe};
use common::*;
use deadpool_postgres::Pool;

/// How one run of the binary ended.
struct Exit {
    success: bool,
    stderr: String,
    stats: Option<StatsSnapshot>,
}

/// Runs `batch-inbox run` against `kafka` and database `url`, with `FAILPOINTS` = `failpoints`
/// and extra flags; waits at most 90 s.
fn run_binary(url: &str, kafka: &Kafka, failpoints: &str, extra: &[&str]) -> Exit {
    let report = tempfile_path("report.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_batch-inbox"));
    cmd.args(["run", "--database-url", url, "--brokers", &kafka.brokers])
        .args(["--topic", &kafka.topic, "--group", "g"])
        .args(["--batch-size", "50", "--batch-linger-ms", "5"])
        .args([
            "-X",
            "session.timeout.ms=6000",
            "-X",
            "heartbeat.interval.ms=500",
        ])
        .args(["-X", "max.poll.interval.ms=7000"])
        .args(["--stats-file", report.to_str().unwrap()])
        .args(extra)
        .env("FAILPOINTS", failpoints)
        .env("RUST_LOG", "info,rdkafka=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("the binary starts");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(90);
    let waiter = std::thread::spawn(move || child.wait_with_output());
    while !waiter.is_finished() {
        if Instant::now() > deadline {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("the processor did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = waiter.join().unwrap().unwrap();
    let stats = std::fs::read(&report).ok().map(|bytes| {
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        serde_json::from_value(v["stats"].clone()).unwrap()
    });
    let _ = std::fs::remove_file(&report);
    Exit {
        success: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stats,
    }
}

fn tempfile_path(name: &str) -> std::path::PathBuf {
    let unique = format!("{}-{}-{name}", std::process::id(), rand_suffix());
    std::env::temp_dir().join(unique)
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

/// A test's input: `messages` generated records (with duplicates, bad input and overdrafts) on a
/// two-partition topic, of which the first half is produced at once and the rest by
/// [`Input::produce_the_rest`].
struct Input {
    url: String,
    pool: Pool,
    kafka: Kafka,
    expected: Expected,
    rest: Vec<Record>,
}

async fn setup(name: &str, messages: u64) -> Input {
    let (url, pool) = fresh_db(name).await;
    let kafka = Kafka::new(name, 2);
    let (mut first, expected) = generate(GeneratorSettings {
        messages,
        accounts: 30,
        seed: 7,
        ..GeneratorSettings::default()
    });
    let rest = first.split_off(first.len() / 2);
    kafka.send_generated(first).await;
    Input {
        url,
        pool,
        kafka,
        expected,
        rest,
    }
}

impl Input {
    async fn produce_the_rest(&mut self) {
        self.kafka
            .send_generated(std::mem::take(&mut self.rest))
            .await;
    }

    /// Runs the processor on the first half until `failpoints` crash it.
    fn crash(&self, failpoints: &str, flags: &[&str]) -> Exit {
        let crashed = run_binary(&self.url, &self.kafka, failpoints, flags);
        assert!(!crashed.success, "{failpoints}: the run must crash");
        crashed
    }

    /// Produces the second half, then runs the processor until the topic is done.
    async fn restart(&mut self, flags: &[&str]) -> Exit {
        self.produce_the_rest().await;
        let flags: Vec<&str> = flags.iter().copied().chain(["--exit-on-eof"]).collect();
        let restarted = run_binary(&self.url, &self.kafka, "", &flags);
        assert!(restarted.success, "{}", restarted.stderr);
        restarted
    }
}

/// Inbox rows and the sum of the partitions' next offsets stored in the database.
async fn progress(pool: &Pool) -> (i64, i64) {
    let c = pool.get().await.unwrap();
    let row = c
        .query_one(
            "SELECT (SELECT count(*) FROM inbox),
                    (SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offsets)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// A lower bound of the records committed (per partition, one past the highest offset in the
/// inbox or the dead letters; a committed batch of duplicates only leaves no trace).
async fn committed_at_least(pool: &Pool) -> i64 {
    let c = pool.get().await.unwrap();
    c.query_one(
        "SELECT coalesce(sum(last + 1), 0)::bigint FROM (
             SELECT partition, max(\"offset\") AS last FROM (
                 SELECT partition, \"offset\" FROM inbox
                 UNION ALL SELECT partition, \"offset\" FROM dead_letters) AS r
             GROUP BY partition) AS p",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

async fn differences_now(pool: &Pool, expected: &Expected) -> Vec<String> {
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    differences(&observed, expected)
}

/// Crashes at `failpoint`, restarts with `restart_flags`; returns the restart's stats, (inbox
/// rows, stored offsets, committed records at least) at the crash and the records produced,
/// after checking the exact final state.
async fn crash_and_restart(
    name: &str,
    failpoint: &str,
    crash_flags: &[&str],
    restart_flags: &[&str],
) -> (StatsSnapshot, (i64, i64, i64), u64) {
    let messages = 600;
    let mut input = setup(name, messages).await;
    let crashed = input.crash(failpoint, crash_flags);
    assert!(
        crashed.stderr.contains("crashing"),
        "{failpoint}: {}",
        crashed.stderr
    );
    let pool = input.pool.clone();
    let (inbox, stored) = progress(&pool).await;
    let at_crash = (inbox, stored, committed_at_least(&pool).await);
    assert!(at_crash.0 > 0, "{failpoint}: some batches committed first");
    assert!(
        at_crash.0 < input.expected.new as i64,
        "{failpoint}: input left for the restart"
    );

    let restarted = input.restart(restart_flags).await;
    let stats = restarted.stats.expect("the restart wrote its report");
    let expected = &input.expected;
    assert_eq!(
        differences_now(&pool, expected).await,
        Vec::<String>::new(),
        "{failpoint}: exact totals after the restart"
    );
    // Every id the restart inserted was missing at the crash: a replayed record's RETURNING
    // named nothing.
    assert_eq!(
        stats.new as i64,
        expected.new as i64 - at_crash.0,
        "{failpoint}"
    );
    (stats, at_crash, messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_any_failpoint_then_a_restart_gives_exact_totals() {
    let fast_commits = ["-X", "auto.commit.interval.ms=20"];
    for (name, failpoint) in [
        ("crash_before_commit", "before_commit=2*off->return(crash)"),
        (
            "crash_after_commit",
            "after_commit_before_offset=2*off->return(crash)",
        ),
        (
            "crash_after_store",
            "after_offset_store=2*off->return(crash)",
        ),
        (
            "crash_after_offset_commit",
            "after_offset_commit=return(crash)",
        ),
    ] {
        let (stats, (_, stored_next, _), messages) =
            crash_and_restart(name, failpoint, &fast_commits, &[]).await;
        eprintln!("{failpoint}: stored at the crash {stored_next}, restart {stats:?}");
        // Offsets in the database: nothing committed before the crash is read again.
        assert_eq!(
            stats.records as i64,
            messages as i64 - stored_next,
            "{failpoint}: the restart reads exactly what was not committed"
        );
        if failpoint.starts_with("after_commit_before_offset") {
            assert!(
                stats.replays_avoided > 0,
                "the batch committed but not stored in Kafka is not read again"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_offsets_in_the_database_the_replayed_batch_adds_nothing() {
    let off = ["--offsets-in-db=false"];
    let (stats, (_, stored_next, committed), messages) = crash_and_restart(
        "crash_replay",
        "after_commit_before_offset=2*off->return(crash)",
        &off,
        &off,
    )
    .await;
    assert_eq!(
        stored_next, 0,
        "nothing stored in the database when turned off"
    );
    // Records read again: a lower bound, since `committed` is one.
    let replayed = stats.records as i64 - (messages as i64 - committed);
    assert!(
        replayed > 0,
        "the batch committed before the crash is read again: {stats:?}"
    );
    assert_eq!(stats.replays_avoided, 0);
}

#[cfg(feature = "unsafe-controls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_reports_loss_when_offsets_are_committed_before_the_database() {
    let mut input = setup("control_loss", 600).await;
    // Kafka's committed offsets only: with offsets in the database the restart starts from the
    // database's position, and a premature Kafka commit loses nothing.
    let unsafe_flags = [
        "--unsafe-offsets-before-commit",
        "--offsets-in-db=false",
        "-X",
        "auto.commit.interval.ms=50",
    ];
    // The batch's offset is committed to Kafka while its transaction stalls, then the process
    // dies before COMMIT.
    let crashed = input.crash(
        "before_commit=2*off->return(delay_crash:1500)",
        &unsafe_flags,
    );
    assert!(
        crashed.stderr.contains("UNSAFE"),
        "the control warns loudly"
    );
    input.restart(&unsafe_flags).await;
    let found = differences_now(&input.pool, &input.expected).await;
    assert!(
        found.iter().any(|d| d.contains("inbox")),
        "the check must report the lost messages: {found:?}"
    );
}

#[cfg(feature = "unsafe-controls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_reports_double_application_without_the_inbox() {
    let mut input = setup("control_double", 600).await;
    let unsafe_flags = ["--unsafe-no-inbox", "--offsets-in-db=false"];
    input.crash(
        "after_commit_before_offset=2*off->return(crash)",
        &unsafe_flags,
    );
    input.restart(&unsafe_flags).await;
    let found = differences_now(&input.pool, &input.expected).await;
    assert!(
        found
            .iter()
            .any(|d| d.contains("balance") || d.contains("total")),
        "the check must report the double application: {found:?}"
    );
}

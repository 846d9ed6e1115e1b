//! `--exit-on-eof` means the topic is done for the whole group: a member exits 0 only when every
//! partition of the topic is committed to its end, also the partitions another member holds
//! (a killed member keeps its partitions until its session expires) and also when it holds no
//! partition at all.

use crate::common;
use crate::common::group;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use batch_inbox_tools::generate::{generate, Expected, GeneratorSettings};
use batch_inbox_tools::verify::{differences, observe};
use common::*;
use deadpool_postgres::Pool;

async fn differences_now(pool: &Pool, expected: &Expected) -> Vec<String> {
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    differences(&observed, expected)
}

fn input(messages: u64) -> (Vec<batch_inbox_tools::generate::Record>, Expected) {
    generate(GeneratorSettings {
        messages,
        accounts: 40,
        seed: 11,
        ..GeneratorSettings::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_a_partition_exits_once_the_group_committed_the_topic() {
    let (_, pool) = fresh_db("eof_no_partition").await;
    let kafka = Kafka::new("eof-no-partition", 1);
    let (records, expected) = input(800);
    kafka.send_generated(records).await;

    // A runs until stopped and holds the only partition; B, with --exit-on-eof, gets nothing.
    let mut long_running = config(kafka.settings("g"), batch_inbox::Mode::Batched, 50);
    long_running.exit_on_eof = false;
    let a = group::Member::start(long_running, &pool);
    group::wait_for("A applies records", 60, || async {
        group::inbox_rows(&pool).await > 0
    })
    .await;
    let b = drain(
        config(kafka.settings("g"), batch_inbox::Mode::Batched, 50),
        &pool,
    )
    .await;
    assert_eq!(b.records, 0, "B held no partition: {b:?}");
    // B exited: the whole topic is applied, by A.
    assert_eq!(
        differences_now(&pool, &expected).await,
        Vec::<String>::new()
    );
    a.stop().await;
}

/// A `batch-inbox run` process whose log lines arrive on a channel.
struct Process {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Process {
    fn start(url: &str, kafka: &Kafka, extra: &[&str]) -> Process {
        let mut child = Command::new(env!("CARGO_BIN_EXE_batch-inbox"))
            .args(["run", "--database-url", url, "--brokers", &kafka.brokers])
            .args([
                "--topic",
                &kafka.topic,
                "--group",
                "g",
                "--log-interval",
                "0",
            ])
            .args(["-X", "heartbeat.interval.ms=500"])
            .args(extra)
            .env("RUST_LOG", "info,rdkafka=warn")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stderr = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Process {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits until `count` log lines contain `needle`; fails after `secs` seconds.
    fn wait_for_lines(&mut self, needle: &str, count: usize, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while self.seen.iter().filter(|l| l.contains(needle)).count() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!(
                    "no {count} lines with {needle:?} within {secs} s; log:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits for the process to exit; returns whether it succeeded and its whole log.
    fn wait(mut self, secs: u64) -> (bool, String) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.seen.extend(self.lines.try_iter());
                return (status.success(), self.seen.join("\n"));
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("no exit within {secs} s; log:\n{}", self.seen.join("\n"));
            }
            self.seen.extend(self.lines.try_iter());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_whose_session_has_not_expired_keeps_the_others_waiting() {
    let (url, pool) = fresh_db("eof_killed_member").await;
    let kafka = Kafka::new("eof-killed-member", 4);
    let (records, expected) = input(2000);
    kafka.send_generated(records).await;

    // Member A reads its partitions but never closes a batch by itself (no end-of-partition
    // flush without --exit-on-eof, a 10-minute linger): it holds records it has not committed.
    let mut a = Process::start(
        &url,
        &kafka,
        &[
            "--batch-size",
            "1000000",
            "--batch-linger-ms",
            "600000",
            "-X",
            "session.timeout.ms=6000",
        ],
    );
    a.wait_for_lines("partition assigned", 4, 60);
    // Member B joins: the cooperative rebalance moves two partitions from A to B (A commits
    // what it read of them as they leave).
    let mut b = Process::start(
        &url,
        &kafka,
        &["--exit-on-eof", "-X", "session.timeout.ms=6000"],
    );
    b.wait_for_lines("partition assigned", 1, 60);
    // A dies holding two partitions; the group keeps them A's until its session expires.
    a.kill();
    // B drains its own partitions, then waits for the group instead of exiting...
    b.wait_for_lines("waiting for the group to commit the rest", 1, 60);
    // ... until A's partitions come to it and it has applied them too.
    let (success, log) = b.wait(120);
    assert!(success, "B exits 0 once the topic is done; log:\n{log}");
    assert_eq!(
        differences_now(&pool, &expected).await,
        Vec::<String>::new(),
        "exit 0 means every record of the topic is applied; log:\n{log}"
    );
}

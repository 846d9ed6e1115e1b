//! A real Kafka-protocol broker for end-to-end tests: the one named by `KAFKA_BROKERS`, which
//! `scripts/test.sh` starts once per run (an Apache Kafka node, `scripts/kafka/lib.sh`), or any
//! other Kafka-protocol broker; else a nisshi process when `NISSHI_BIN` names a build. Tests name
//! their topics with [`Broker::topic`], so that runs against a long-lived broker never meet an
//! earlier run's topic.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running broker; a process started here is killed on drop.
pub struct Broker {
    child: Option<Child>,
    pub addr: String,
}

impl Broker {
    /// The broker of `KAFKA_BROKERS`, else a new nisshi process of `NISSHI_BIN` on a free port.
    pub fn start() -> Broker {
        match std::env::var("KAFKA_BROKERS") {
            Ok(addr) if !addr.is_empty() => Broker { child: None, addr },
            _ => match std::env::var_os("NISSHI_BIN") {
                Some(bin) if !bin.is_empty() => Self::start_nisshi(bin.into()),
                _ => panic!(
                    "this test needs a Kafka broker: run it through scripts/test.sh, which starts \
                     Apache Kafka, or set KAFKA_BROKERS=host:port (or NISSHI_BIN)"
                ),
            },
        }
    }

    /// A topic name for this test run: `name` with the process id and a counter.
    pub fn topic(&self, name: &str) -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        format!("{name}-{}-{n}", std::process::id())
    }

    /// A consumer group for a test on `topic` (a name from [`Broker::topic`]): one broker serves
    /// every test of a run, and a group is one group whatever its topics, so two tests that
    /// both said "g" would share members, rebalances and session timeouts.
    pub fn group(topic: &str, name: &str) -> String {
        format!("{topic}.{name}")
    }

    fn start_nisshi(bin: PathBuf) -> Broker {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let url = format!("tcp://{addr}");
        let mut child = Command::new(&bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://nisshi/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e} (NISSHI_BIN)", bin.display()));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("nisshi exited before listening on {addr}: {status}");
            }
            assert!(Instant::now() < deadline, "nisshi did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Broker {
            child: Some(child),
            addr,
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

//! A real Kafka-protocol broker for end-to-end tests: a nisshi process (in-memory storage) that
//! `scripts/test.sh` builds once per machine (`scripts/lib.sh`, `ensure_nisshi`), or the broker
//! named by `KAFKA_BROKERS` (Apache Kafka, Redpanda, …). Tests name their topics with
//! [`Broker::topic`], so that runs against a long-lived broker never meet an earlier run's topic.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The version `scripts/lib.sh` installs.
const NISSHI_VERSION: &str = "0.8.1";

/// A running broker; a process started here is killed on drop.
pub struct Broker {
    child: Option<Child>,
    pub addr: String,
}

/// `NISSHI_BIN`, else the build `scripts/lib.sh` keeps in the cache directory, else `nisshi` on
/// the PATH.
fn nisshi_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("NISSHI_BIN") {
        return p.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_default();
    let cached = cache
        .join("batch-inbox")
        .join(format!("nisshi-{NISSHI_VERSION}"))
        .join("bin/nisshi");
    if cached.exists() {
        cached
    } else {
        "nisshi".into()
    }
}

impl Broker {
    /// The broker of `KAFKA_BROKERS`, else a new nisshi process on a free port.
    pub fn start() -> Broker {
        match std::env::var("KAFKA_BROKERS") {
            Ok(addr) if !addr.is_empty() => Broker { child: None, addr },
            _ => Self::start_nisshi(),
        }
    }

    /// A topic name for this test run: `name` with the process id and a counter.
    pub fn topic(&self, name: &str) -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        format!("{name}-{}-{n}", std::process::id())
    }

    fn start_nisshi() -> Broker {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let url = format!("tcp://{addr}");
        let bin = nisshi_bin();
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
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}; scripts/test.sh builds nisshi once per machine",
                    bin.display()
                )
            });
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

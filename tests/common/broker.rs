//! A nisshi broker process (a real Kafka-protocol broker, in-memory storage) for end-to-end
//! tests. `scripts/test.sh` builds it once per machine (`scripts/lib.sh`, `ensure_nisshi`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The version `scripts/lib.sh` installs.
const NISSHI_VERSION: &str = "0.8.1";

/// A running broker, killed on drop.
pub struct Broker {
    child: Child,
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
    pub fn start() -> Broker {
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
        Broker { child, addr }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

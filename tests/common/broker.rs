//! A tansu broker process (a real Kafka-protocol broker) for end-to-end tests.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running broker, killed on drop.
pub struct Broker {
    child: Child,
    pub addr: String,
}

/// `TANSU_BIN`, else `~/.cargo/bin/tansu`, else `tansu` on the PATH.
fn tansu_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TANSU_BIN") {
        return p.into();
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let cargo_bin = home.join(".cargo/bin/tansu");
    if cargo_bin.exists() {
        cargo_bin
    } else {
        "tansu".into()
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
        let child = Command::new(tansu_bin())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu must be installed: scripts/install-tansu.sh");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {addr}");
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

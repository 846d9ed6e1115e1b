//! The binary as a running process: its output read line by line while it runs, the address of
//! its operations listener, and a stop by SIGTERM (`common::child`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a finished process wrote, and how it ended.
pub struct Finished {
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Panics, showing what the process wrote, unless it exited with `code`.
    #[track_caller]
    pub fn assert_exit(&self, code: i32) {
        assert_eq!(
            self.code,
            Some(code),
            "stdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
    }
}

/// A running `batch-inbox` process.
pub struct Running {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

fn read_lines(from: impl Read + Send + 'static, into: Arc<Mutex<Vec<String>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            match line {
                Ok(l) => into.lock().unwrap().push(l),
                Err(_) => return,
            }
        }
    })
}

impl Running {
    /// Starts the binary with `args` and `env`, without the caller's `DATABASE_URL`,
    /// `KAFKA_BROKERS`, `RUST_LOG` or `BATCH_INBOX_*` variables.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_batch-inbox"));
        cmd.args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("BATCH_INBOX_")
                || ["DATABASE_URL", "KAFKA_BROKERS", "RUST_LOG"].contains(&k.as_str())
            {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            read_lines(child.stdout.take().expect("piped"), stdout.clone()),
            read_lines(child.stderr.take().expect("piped"), stderr.clone()),
        ];
        Running {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// The lines written to stderr so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// The operations listener's address, from its log line (waits for it, at most 60 s).
    pub async fn metrics_addr(&mut self) -> SocketAddr {
        const MARK: &str = "serving /metrics, /healthz and /readyz on http://";
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = self.stderr_lines().iter().find_map(|l| {
                let rest = &l[l.find(MARK)? + MARK.len()..];
                let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'));
                rest[..end.unwrap_or(rest.len())].parse().ok()
            });
            if let Some(addr) = found {
                return addr;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("exited with {status}: {:#?}", self.stderr_lines());
            }
            assert!(
                Instant::now() < deadline,
                "no listener: {:#?}",
                self.stderr_lines()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to exit (at most `limit`, then kills it and panics).
    pub async fn wait(mut self, limit: Duration) -> Finished {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waitpid") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("did not exit within {limit:?}: {:#?}", self.stderr_lines());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        for r in self.readers.drain(..) {
            r.join().expect("reader thread");
        }
        Finished {
            code: status.code(),
            stdout: self.stdout.lock().unwrap().join("\n"),
            stderr: self.stderr.lock().unwrap().join("\n"),
        }
    }

    /// Kills the process (SIGKILL: no shutdown, no final commit) and waits for it.
    pub async fn kill(mut self) -> Finished {
        self.child.kill().expect("SIGKILL");
        self.wait(Duration::from_secs(60)).await
    }

    /// Asks the process to stop (SIGTERM) and waits for it (at most 60 s).
    pub async fn stop(self) -> Finished {
        let term = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(term.success());
        self.wait(Duration::from_secs(60)).await
    }
}

impl Drop for Running {
    /// A test that fails midway leaves no process behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

//! A private PostgreSQL server for tests that stop, kill or restart the database: its own data
//! directory and port, so the shared server on 5432 (and every other test) is never disturbed.
//! Used as `common::postgres`.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A PostgreSQL server in a temporary directory, stopped (immediately) and removed on drop.
pub struct PrivatePostgres {
    dir: PathBuf,
    pub port: u16,
}

/// The directory of `initdb`, `pg_ctl` and `postgres`: `PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin`.
fn pg_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PG_BIN") {
        return p.into();
    }
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql (or set PG_BIN)")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    let v = versions.last().expect("a PostgreSQL version directory");
    PathBuf::from(format!("/usr/lib/postgresql/{v}/bin"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// Runs a server binary, as user `postgres` when the tests run as root (PostgreSQL refuses root).
fn run(bin: &str, args: &[&str]) -> Output {
    let path = pg_bin().join(bin);
    let out = if is_root() {
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(&path)
            .args(args)
            .output()
    } else {
        Command::new(&path).args(args).output()
    };
    out.unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()))
}

fn chown_postgres(dir: &Path) {
    if is_root() {
        let ok = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .expect("chown")
            .success();
        assert!(ok, "chown of {}", dir.display());
    }
}

impl PrivatePostgres {
    /// Creates a cluster (trust auth, `fsync` on: durability is what the tests are about) on a free
    /// port and starts it.
    pub fn start() -> PrivatePostgres {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("bi-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        chown_postgres(&dir);
        let data = dir.join("data");
        let out = run(
            "initdb",
            &[
                "-D",
                data.to_str().expect("utf-8 path"),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        assert!(out.status.success(), "initdb: {out:?}");
        let pg = PrivatePostgres { dir, port };
        pg.start_server();
        pg
    }

    fn data(&self) -> String {
        self.dir
            .join("data")
            .to_str()
            .expect("utf-8 path")
            .to_owned()
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start_server(&self) {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c max_connections=100",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log");
        let out = run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                log.to_str().expect("utf-8 path"),
                "-o",
                &opts,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        assert!(out.status.success(), "pg_ctl start: {out:?}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "PostgreSQL did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server like a crash (`-m immediate`: no checkpoint, every session cut).
    pub fn stop_immediate(&self) {
        let out = run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
        assert!(out.status.success(), "pg_ctl stop: {out:?}");
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `<prefix><name>` ([`super::db_name`]) on this server with the core's
    /// and the ledger's tables; returns its URL and a pool of two connections.
    pub async fn ledger_db(&self, name: &str) -> (String, deadpool_postgres::Pool) {
        let name = super::db_name(name);
        let admin = batch_inbox::db::connect(&self.url("postgres"), 1)
            .await
            .unwrap();
        admin
            .get()
            .await
            .unwrap()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let url = self.url(&name);
        let pool = batch_inbox::db::connect(&url, 2).await.unwrap();
        batch_inbox::db::migrate(&pool).await.unwrap();
        batch_inbox::ledger::migrate(&pool).await.unwrap();
        (url, pool)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

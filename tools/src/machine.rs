//! What a result was measured on. [`host`]: the machine's facts that reports name (UTC time to
//! the minute, cores, memory, kernel, CPU model, load average), read from the kernel. The
//! `machine` subcommand writes the load test's `machine.json`: those facts, the PostgreSQL server
//! (version, `synchronous_commit`, `fsync`, and pg_test_fsync's fdatasync rate: one WAL flush per
//! commit, the per-message baseline's ceiling), then the run's parameters as the script gives
//! them.
//!
//! Invariant: `machine.json` keeps the keys and order of `results/loadtest/machine.json` (the
//! facts first, then the parameters in the order given); a parameter never replaces a fact, and
//! a rate pg_test_fsync did not give is `null`, never a guess.

pub mod host;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::ser::SerializeMap;
use serde_json::Value;

/// `machine` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct MachineArgs {
    /// Where to write the JSON.
    #[arg(long)]
    pub out: PathBuf,
    /// The PostgreSQL server measured (its settings are read; pg_test_fsync runs beside its data
    /// directory, which must be on this machine).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub server_url: String,
    /// A parameter of the run, written after the machine's facts in the order given: VALUE as a
    /// JSON number or boolean when it reads as one (40000, 0.1, true), otherwise as a string.
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, Value)>,
}

/// A JSON object whose keys keep the order they were pushed in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ordered(pub Vec<(String, Value)>);

impl Ordered {
    /// Appends `key`; an error when it is there already.
    pub fn push(&mut self, key: &str, value: impl Into<Value>) -> Result<()> {
        if self.0.iter().any(|(k, _)| k == key) {
            bail!("{key} is given twice");
        }
        self.0.push((key.to_owned(), value.into()));
        Ok(())
    }
}

impl serde::Serialize for Ordered {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// `KEY=VALUE` of `--param`.
pub fn parse_param(s: &str) -> Result<(String, Value), String> {
    let (key, value) = s
        .split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    Ok((key.to_owned(), param_value(value)))
}

/// A parameter's value: a JSON number or boolean when it reads as one, otherwise the string.
pub fn param_value(s: &str) -> Value {
    match serde_json::from_str::<Value>(s) {
        Ok(v @ (Value::Number(_) | Value::Bool(_))) => v,
        _ => Value::String(s.to_owned()),
    }
}

/// The server's facts, as `machine.json` names them.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    /// `server_version`.
    pub version: String,
    /// `synchronous_commit`.
    pub synchronous_commit: String,
    /// `fsync`.
    pub fsync: String,
    /// fdatasync operations per second of one 8 kB write, from pg_test_fsync.
    pub fdatasync_ops_per_s: Option<f64>,
}

/// The whole document: the host's facts, the server's, then `params`.
pub fn document(
    date: String,
    host: &host::Facts,
    server: &Server,
    params: &[(String, Value)],
) -> Result<Ordered> {
    let mut doc = Ordered::default();
    doc.push("date", format!("{date} UTC"))?;
    doc.push("cores", host.cores)?;
    doc.push("memory_gib", host.memory_gib)?;
    doc.push("kernel", host.kernel.clone())?;
    doc.push("postgres_version", server.version.clone())?;
    doc.push("synchronous_commit", server.synchronous_commit.clone())?;
    doc.push("fsync", server.fsync.clone())?;
    doc.push(
        "pg_test_fsync_fdatasync_ops_per_s",
        server.fdatasync_ops_per_s.map_or(Value::Null, Value::from),
    )?;
    for (k, v) in params {
        doc.push(k, v.clone())
            .with_context(|| format!("--param {k}: a fact of machine.json"))?;
    }
    Ok(doc)
}

/// Runs `machine`.
pub async fn run(args: &MachineArgs) -> Result<()> {
    let server = server(&args.server_url).await?;
    let doc = document(
        host::utc_now_minutes(),
        &host::Facts::read()?,
        &server,
        &args.params,
    )?;
    std::fs::write(&args.out, serde_json::to_vec_pretty(&doc)?)
        .with_context(|| format!("writing {}", args.out.display()))
}

async fn server(url: &str) -> Result<Server> {
    let pool = batch_inbox::db::connect(url, 1)
        .await
        .context("connecting to PostgreSQL")?;
    let client = pool.get().await.context("connecting to PostgreSQL")?;
    let row = client
        .query_one(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'),
                    current_setting('fsync'), current_setting('data_directory')",
            &[],
        )
        .await
        .context("reading PostgreSQL's settings")?;
    let data_dir: String = row.get(3);
    Ok(Server {
        version: row.get(0),
        synchronous_commit: row.get(1),
        fsync: row.get(2),
        fdatasync_ops_per_s: fsync_rate(Path::new(&data_dir)),
    })
}

/// pg_test_fsync of the newest PostgreSQL installed (Debian's /usr/lib/postgresql/VERSION), one
/// second per method, on a file beside `data_dir`; `None` without the tool or its figure.
fn fsync_rate(data_dir: &Path) -> Option<f64> {
    let tool = newest_pg_tool(Path::new("/usr/lib/postgresql"), "pg_test_fsync")?;
    let file = data_dir.join("..").join("batch_inbox_fsync_test");
    let out = std::process::Command::new(&tool)
        .arg("-s")
        .arg("1")
        .arg("-f")
        .arg(&file)
        .output()
        .ok()?;
    fdatasync_rate(&String::from_utf8_lossy(&out.stdout))
}

/// `ROOT/VERSION/bin/NAME` of the highest VERSION (compared as numbers: 9.6 < 15) that has it.
pub fn newest_pg_tool(root: &Path, name: &str) -> Option<PathBuf> {
    let version = |s: &str| -> Option<Vec<u64>> { s.split('.').map(|p| p.parse().ok()).collect() };
    std::fs::read_dir(root)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = version(e.file_name().to_str()?)?;
            let tool = e.path().join("bin").join(name);
            tool.is_file().then_some((v, tool))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, tool)| tool)
}

/// The first `fdatasync   N ops/sec` of pg_test_fsync's output (its one-write comparison).
pub fn fdatasync_rate(output: &str) -> Option<f64> {
    output.lines().find_map(|line| {
        let rest = line.split_once("fdatasync")?.1;
        if !rest.starts_with(char::is_whitespace) {
            return None;
        }
        let mut words = rest.split_whitespace();
        let rate = words.next()?.parse::<f64>().ok()?;
        (words.next() == Some("ops/sec")).then_some(rate)
    })
}

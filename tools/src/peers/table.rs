//! `peers table`: the results of `scripts/peers/compare.sh` in its OUT directory: `rows.jsonl`
//! (the runs' rows, copied), `machine.json` (what ran where) and `results.md` (a table per work,
//! also printed).
//!
//! Invariant: a kill run's msgs/s and CPU are never shown (its clock ran through a kill and a
//! restart); the "added by the kill" columns subtract the same sink's run without a kill in its
//! default configuration, and show `-` when there is none.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

use crate::generate::Expected;
use crate::machine::host;

/// `peers table` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct TableArgs {
    /// The runs' rows (`peers row`).
    #[arg(long)]
    pub rows: PathBuf,
    /// The model of the input (`produce --expect`).
    #[arg(long)]
    pub expect: PathBuf,
    /// The results directory.
    #[arg(long)]
    pub out: PathBuf,
    /// The broker, as the results name it.
    #[arg(long)]
    pub broker: String,
    /// Input records.
    #[arg(long)]
    pub messages: u64,
    /// Partitions of the topic.
    #[arg(long)]
    pub partitions: u64,
    /// Customers (keys, one account each).
    #[arg(long)]
    pub accounts: u64,
    /// The peer's offset.flush.interval.ms.
    #[arg(long)]
    pub flush_ms: u64,
    /// The PostgreSQL server, for its version.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub server_url: String,
    /// What else ran on the machine during the measurement, as the operator states it.
    #[arg(
        long,
        default_value = "other work on the machine during the measurement not stated"
    )]
    pub machine_note: String,
}

/// The input as `machine.json` names it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Input {
    /// Records produced.
    pub records: u64,
    /// Partitions.
    pub partitions: u64,
    /// Customers.
    pub customers: u64,
    /// New records.
    pub new: u64,
    /// Duplicates.
    pub duplicates: u64,
}

/// `machine.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[allow(missing_docs)]
pub struct Machine {
    pub date_utc: String,
    pub cpu: String,
    pub cores: u64,
    pub memory_gib: f64,
    pub kernel: String,
    pub load_average_at_end: Vec<String>,
    pub other_work: String,
    pub postgres: String,
    pub java: String,
    pub broker: String,
    pub input: Input,
    pub peer_offset_flush_interval_ms: u64,
    pub work: Vec<String>,
}

/// The works in the table's order, those with a row.
pub fn works(rows: &[Value]) -> Vec<String> {
    ["upsert", "additive"]
        .iter()
        .filter(|w| rows.iter().any(|r| work_of(r) == **w))
        .map(|w| (*w).to_owned())
        .collect()
}

fn work_of(r: &Value) -> &str {
    r["work"].as_str().unwrap_or("upsert")
}

/// `n` with a comma every three digits (`-1,234,567`).
pub fn grouped(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// A float as Python's `str` spells it for the figures here (`23.5`, `24.0`).
pub fn py_float(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        x.to_string()
    }
}

/// An integer of the state (a number, or a number's text), `None` when null or absent.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A value as Python's `str` prints it (the table's plain cells).
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "None".to_owned(),
        other => other.to_string(),
    }
}

/// A kill run's msgs/s and CPU are not measured.
fn measured(r: &Value) -> bool {
    !r["label"].as_str().unwrap_or("").contains("kill")
}

fn rate_and_cpu(r: &Value) -> String {
    if !measured(r) {
        return "- | - | - | - | -".to_owned();
    }
    let c = &r["cpu_ms_per_1k"];
    let cpu: Vec<String> = ["sink", "postgres", "broker", "machine"]
        .iter()
        .map(|k| format!("{:.0}", c[*k].as_f64().unwrap_or(0.0)))
        .collect();
    format!(
        "{} | {}",
        grouped(int(&r["msgs_per_s"]).unwrap_or(0)),
        cpu.join(" | ")
    )
}

const CPU: &str = "CPU is in ms per 1000 records, over the run's wall time: the sink process (the \
Connect JVM after its task started, or our processor from start to exit), PostgreSQL (every \
backend), the broker, and the whole machine (other work included). A kill run's msgs/s and CPU \
are not measured (`-`).";

/// `results.md`: `rows` of the runs, the model `expect`, the `machine`.
pub fn markdown(rows: &[Value], expect: &Expected, m: &Machine) -> String {
    let keys = expect.last_new.len();
    let label = |r: &Value| r["label"].as_str().unwrap_or("").to_owned();
    let note = |r: &Value| r["note"].as_str().unwrap_or("").to_owned();
    let mut lines: Vec<String> = vec![
        "# batch-inbox and Kafka Connect + Debezium's JDBC sink, the same input".into(),
        String::new(),
        format!(
            "Written by `scripts/peers/compare.sh` on {} UTC: {} cores ({}), {} GiB, **{}** \
             (load average at the end: {}). Broker: {}.",
            m.date_utc,
            m.cores,
            m.cpu,
            py_float(m.memory_gib),
            m.other_work,
            m.load_average_at_end.join(" "),
            m.broker
        ),
        String::new(),
        format!(
            "Input: {} records on {} partitions, {} customers (keys, one account each), {} new \
             records and {} duplicates (records re-sent with the id and value of an earlier \
             one), as a Kafka Connect JSON envelope (`batch-inbox-bench produce --envelope \
             connect-json --bad-ratio 0`). The same topic for every run; each run on a database \
             of its own.",
            m.input.records, m.input.partitions, m.input.customers, expect.new, expect.duplicates
        ),
        String::new(),
    ];
    if m.work.iter().any(|w| w == "upsert") {
        lines.extend([
            "## Last write wins".to_owned(),
            String::new(),
            format!(
                "The latest entry per customer on the same table \
                 (`examples/sql/customer_entries.ddl.sql`): ours \
                 `examples/sql/customer_entries.sql`, the peer in upsert mode \
                 (`scripts/peers/connector.properties`). {CPU}"
            ),
            String::new(),
            "| run | msgs/s | sink CPU | PostgreSQL CPU | broker CPU | machine CPU | rows = last new of key | rows = last in topic | writes | ids applied twice | writes added by the kill | note |".to_owned(),
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |".to_owned(),
        ]);
        let up: Vec<&Value> = rows.iter().filter(|r| work_of(r) == "upsert").collect();
        // A kill run's writes beyond those of the same sink's run without a kill (its default
        // configuration): what the restart applied again.
        let writes = |l: &str| {
            up.iter()
                .rev()
                .find(|r| label(r) == l)
                .and_then(|r| int(&r["state"]["applications"]))
        };
        for r in &up {
            let s = &r["state"];
            let apps = int(&s["applications"]);
            let added = if label(r).starts_with("connect-kill") {
                apps.zip(writes("connect-default"))
                    .map(|(a, b)| grouped(a - b))
            } else {
                None
            };
            lines.push(format!(
                "| {} | {} | {} / {keys} | {} / {keys} | {} | {} | {} | {} |",
                label(r),
                rate_and_cpu(r),
                plain(&s["match_last_new"]),
                plain(&s["match_last_sent"]),
                apps.map_or("-".to_owned(), grouped),
                int(&s["ids_applied_twice"]).map_or("-".to_owned(), grouped),
                added.unwrap_or_else(|| "-".to_owned()),
                note(r)
            ));
        }
        lines.extend([
            String::new(),
            "*rows = last new of key*: customers whose row holds the last record of its key that \
             carried a new id (the model when each record is applied once); *rows = last in \
             topic*: the last record of its key in the topic, duplicates included (what a sink \
             that applies every record it reads leaves). *writes*: row writes the trigger logged \
             (our statement writes the newest record of each key in a batch, so fewer than the \
             records); *ids applied twice*: record ids written more than once; *writes added by \
             the kill*: the peer's kill run's writes less those of its run without a kill."
                .to_owned(),
            String::new(),
        ]);
    }
    if m.work.iter().any(|w| w == "additive") {
        let sums = &expect.sums;
        let total: i64 = sums.values().sum();
        lines.extend([
            "## Additive: balance += amount".to_owned(),
            String::new(),
            format!(
                "Each account's balance is the sum of the amounts of its records, each record \
                 counted once: the model is the sum of the new records' amounts per account ({} \
                 accounts, {} in all; no overdraft rule on either side). Ours adds each batch's \
                 new amounts to `balances` (`examples/sql/balances_connect.sql`, one aggregate \
                 `INSERT … ON CONFLICT (account_id) DO UPDATE SET amount = balances.amount + \
                 excluded.amount` per batch). Our reference ledger \
                 (`additive-batch-inbox-ledger`, `--handler ledger`) reads the entry itself, not \
                 an envelope: it runs on the same entries produced once more without it (the same \
                 seed: the same accounts, amounts and duplicates, with ids of their own; a topic \
                 of its own; the same model), and since it refuses overdrafts it is checked \
                 against the model's ledger balances, exactly (`batch-inbox-bench verify`). \
                 Debezium's JDBC sink has no statement that adds to a column, so it keeps a row \
                 per record and its balance is `sum(amount) GROUP BY account_id` over them, in \
                 two ways: `additive-connect-*` inserts a row per record it receives into \
                 `amount_entries` (`scripts/peers/connector-amounts.properties`: \
                 `insert.mode=insert`, `primary.key.mode=none`, a key the database generates); \
                 `additive-by-id-connect-*` upserts a row per record id into \
                 `amount_entries_by_id` (`scripts/peers/connector-amounts-by-id.properties`: \
                 `insert.mode=upsert`, `primary.key.mode=record_value`, \
                 `primary.key.fields=id`, the id the payload carries), so that a record received \
                 again overwrites its own row. The peer's runs are timed until its table holds a \
                 row per record of the topic (insert) or per new id (by id). {CPU}",
                sums.len(),
                grouped(total)
            ),
            String::new(),
            "| run | msgs/s | sink CPU | PostgreSQL CPU | broker CPU | machine CPU | accounts = model | total absolute error | total − model's total | rows | records counted twice | counted twice added by the kill | note |".to_owned(),
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |".to_owned(),
        ]);
        let ad: Vec<&Value> = rows.iter().filter(|r| work_of(r) == "additive").collect();
        let twice = |l: &str| {
            ad.iter()
                .rev()
                .find(|r| label(r) == l)
                .and_then(|r| int(&r["state"]["counted_twice"]))
        };
        let n = |v: Option<i64>| v.map_or("-".to_owned(), grouped);
        for r in &ad {
            let s = &r["state"];
            let l = label(r);
            // The same sink's run without a kill, in its default configuration.
            let added = if l.contains("connect-kill") {
                int(&s["counted_twice"])
                    .zip(twice(&without_kill(&l)))
                    .map(|(a, b)| grouped(a - b))
            } else {
                None
            };
            let off = int(&s["total"])
                .zip(int(&s["model_total"]))
                .map(|(t, m)| t - m);
            lines.push(format!(
                "| {l} | {} | {} / {} | {} | {} | {} | {} | {} | {} |",
                rate_and_cpu(r),
                plain(&s["accounts_right"]),
                plain(&s["accounts"]),
                n(int(&s["abs_error"])),
                n(off),
                n(int(&s["entries"])),
                n(int(&s["counted_twice"])),
                added.unwrap_or_else(|| "-".to_owned()),
                note(r)
            ));
        }
        lines.extend([
            String::new(),
            "*accounts = model*: accounts whose balance equals the model's sum, of the accounts \
             in the model or in the table; *total absolute error*: the sum over accounts of \
             |balance − the model's sum| (amounts are credits and debits, so a record counted \
             twice adds its |amount| or cancels against another one of the same account); \
             *total − model's total*: the sum of all balances less the model's; *rows*: the \
             peer's rows in its table (one per record inserted, or per id upserted); *records \
             counted twice*: the inserting peer's rows beyond the first of each record id (`-` \
             where a primary key holds each id once: our inbox, the peer's table by id; their \
             balances are the check); *counted twice added by the kill*: a kill run's records \
             counted twice less those of the same sink's run without a kill."
                .to_owned(),
            String::new(),
        ]);
    }
    lines.join("\n")
}

/// The label of a kill run's sink without a kill: `…connect-kill-1000` → `…connect-default`.
pub fn without_kill(label: &str) -> String {
    match label.rsplit_once("kill-") {
        Some((head, tail)) if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{head}default")
        }
        _ => label.to_owned(),
    }
}

/// Writes the three files and prints `results.md`.
pub async fn run(args: &TableArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.rows)
        .with_context(|| format!("reading {}", args.rows.display()))?;
    let rows: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {}", args.rows.display()))?;
    let expect = crate::verify::read_expected(&args.expect)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let copy = args.out.join("rows.jsonl");
    std::fs::write(&copy, &text).with_context(|| format!("writing {}", copy.display()))?;
    let facts = host::Facts::read()?;
    let machine = Machine {
        date_utc: host::utc_now_minutes(),
        cpu: host::cpu_model(),
        cores: facts.cores,
        memory_gib: facts.memory_gib,
        kernel: facts.kernel,
        load_average_at_end: host::load_average(),
        other_work: args.machine_note.clone(),
        postgres: postgres_version(&args.server_url).await,
        java: java_version(),
        broker: args.broker.clone(),
        input: Input {
            records: args.messages,
            partitions: args.partitions,
            customers: args.accounts,
            new: expect.new,
            duplicates: expect.duplicates,
        },
        peer_offset_flush_interval_ms: args.flush_ms,
        work: works(&rows),
    };
    let path = args.out.join("machine.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&machine)?)
        .with_context(|| format!("writing {}", path.display()))?;
    let md = markdown(&rows, &expect, &machine);
    let path = args.out.join("results.md");
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    println!("{md}");
    Ok(())
}

/// `SELECT version()`, `""` (with a warning) when the server cannot say.
async fn postgres_version(url: &str) -> String {
    let version = async {
        let pool = batch_inbox::db::connect(url, 1).await?;
        let client = pool.get().await?;
        let row = client.query_one("SELECT version()", &[]).await?;
        anyhow::Ok(row.get::<_, String>(0))
    };
    version.await.unwrap_or_else(|e| {
        eprintln!("peers table: PostgreSQL's version unknown: {e:#}");
        String::new()
    })
}

/// The first line `java -version` prints, `""` without java.
fn java_version() -> String {
    std::process::Command::new("java")
        .arg("-version")
        .output()
        .map(|o| {
            let text = [o.stderr, o.stdout].concat();
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(-1_234_567), "-1,234,567");
        assert_eq!(grouped(180_111), "180,111");
    }

    #[test]
    fn floats_are_spelled_as_python_does() {
        assert_eq!(py_float(23.5), "23.5");
        assert_eq!(py_float(24.0), "24.0");
    }

    #[test]
    fn a_kill_run_compares_with_the_default_run_of_its_sink() {
        assert_eq!(
            without_kill("additive-connect-kill-10000"),
            "additive-connect-default"
        );
        assert_eq!(
            without_kill("additive-by-id-connect-kill-1000"),
            "additive-by-id-connect-default"
        );
        assert_eq!(
            without_kill("additive-batch-inbox-kill"),
            "additive-batch-inbox-kill"
        );
    }

    /// The committed results, rebuilt from the committed rows, machine.json and what results.md
    /// says of the model (its customers, and its sums' count and total).
    #[test]
    fn the_committed_results_are_rebuilt_byte_for_byte() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/peers");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        let rows: Vec<Value> = read("rows.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let m: Value = serde_json::from_str(&read("machine.json")).unwrap();
        let committed = read("results.md");
        let between = |a: &str, b: &str| -> String {
            let from = committed.find(a).unwrap() + a.len();
            committed[from..][..committed[from..].find(b).unwrap()].to_owned()
        };
        let keys: usize = between("| batch-inbox | ", " |\n")
            .rsplit(" / ")
            .next()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let accounts: i64 = between("per account (", " accounts,").parse().unwrap();
        let total: i64 = between(" accounts, ", " in all")
            .replace(',', "")
            .parse()
            .unwrap();
        let mut sums: BTreeMap<i64, i64> = (1..accounts).map(|a| (a, 0)).collect();
        sums.insert(accounts, total);
        let expect = Expected {
            new: m["input"]["new"].as_u64().unwrap(),
            duplicates: m["input"]["duplicates"].as_u64().unwrap(),
            last_new: (0..keys as i64).map(|k| (k, String::new())).collect(),
            sums,
            ..Expected::default()
        };
        let machine: Machine = Machine {
            date_utc: m["date_utc"].as_str().unwrap().into(),
            cpu: m["cpu"].as_str().unwrap().into(),
            cores: m["cores"].as_u64().unwrap(),
            memory_gib: m["memory_gib"].as_f64().unwrap(),
            kernel: m["kernel"].as_str().unwrap().into(),
            load_average_at_end: serde_json::from_value(m["load_average_at_end"].clone()).unwrap(),
            other_work: m["other_work"].as_str().unwrap().into(),
            postgres: m["postgres"].as_str().unwrap().into(),
            java: m["java"].as_str().unwrap().into(),
            broker: m["broker"].as_str().unwrap().into(),
            input: Input {
                records: m["input"]["records"].as_u64().unwrap(),
                partitions: m["input"]["partitions"].as_u64().unwrap(),
                customers: m["input"]["customers"].as_u64().unwrap(),
                new: expect.new,
                duplicates: expect.duplicates,
            },
            peer_offset_flush_interval_ms: m["peer_offset_flush_interval_ms"].as_u64().unwrap(),
            work: works(&rows),
        };
        assert_eq!(
            String::from_utf8(serde_json::to_vec_pretty(&machine).unwrap()).unwrap(),
            read("machine.json")
        );
        assert_eq!(markdown(&rows, &expect, &machine), committed);
    }
}

//! The `cpu` subcommand: the CPU seconds a script's run cost, from one reading before it and one
//! after. `cpu start` reads the targets and keeps the reading in a state file; `cpu stop` reads
//! them again and writes the differences as JSON; `cpu run` does both around a command it runs,
//! and adds the command's own CPU (its reaped process tree, from `getrusage`).
//!
//! Invariant: a figure is written only for a target that was asked for and read at both ends;
//! one that could not be found or read is left out with a warning on stderr, never written as a
//! made-up number, and never fails the run it measures. Each figure is the end's reading minus the start's, never below zero.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{
    pids_named, postgres_cpu_ticks, postmaster_of_data_dir, process_ticks, ticks_to_s, MachineTicks,
};

/// `cpu` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CpuArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: CpuCommand,
}

/// `cpu` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum CpuCommand {
    /// Read the targets now and keep the reading in --state.
    Start(StartArgs),
    /// Read --state's targets again and write the CPU seconds since `cpu start` as JSON:
    /// wall_s, and machine_cpu_s, broker_cpu_s, postgres_cpu_s, process_cpu_s for the targets
    /// asked for.
    Stop(StopArgs),
    /// Run a command between a start and a stop reading; process_cpu_s is the command's own CPU
    /// (its process tree, reaped). Fails when the command fails, after writing the figures.
    Run(RunArgs),
}

/// What to measure.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Targets {
    /// PostgreSQL by its postmaster's pid: the postmaster and its children, ended ones included.
    #[arg(long, value_name = "PID", conflicts_with = "postgres_data")]
    pub postgres_pid: Option<u32>,
    /// PostgreSQL by its data directory (the postmaster's pid from its postmaster.pid).
    #[arg(long, value_name = "DIR")]
    pub postgres_data: Option<PathBuf>,
    /// The broker: a pid, or a process name (every process of that name at `start`: java,
    /// beam.smp, nats-server; the name as /proc/PID/stat keeps it, 15 bytes at most). Its own
    /// CPU, not its children's.
    #[arg(long, value_name = "PID|NAME")]
    pub broker: Option<String>,
    /// The whole machine: busy time of every core (/proc/stat: user, nice, system, irq,
    /// softirq, steal).
    #[arg(long)]
    pub machine: bool,
}

/// `cpu start` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct StartArgs {
    /// Where to keep the reading for `cpu stop`.
    #[arg(long)]
    pub state: PathBuf,
    /// A process: its own CPU (process_cpu_s), read while it runs.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub targets: Targets,
}

/// `cpu stop` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct StopArgs {
    /// The state file of `cpu start`.
    #[arg(long)]
    pub state: PathBuf,
    /// Write the figures here (JSON); stdout otherwise.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `cpu run` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Write the figures here (JSON); stdout otherwise (after the command's own output).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub targets: Targets,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// One process's ticks at a reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reading {
    /// The process (a postmaster for PostgreSQL).
    pub pid: u32,
    /// Its ticks then.
    pub ticks: u64,
}

/// The targets' ticks at one instant: what `cpu start` keeps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Seconds since the Unix epoch.
    pub at_s: f64,
    /// The clock tick the ticks were read with.
    pub hz: u64,
    /// The process of `--pid`.
    pub process: Option<Reading>,
    /// The PostgreSQL server.
    pub postgres: Option<Reading>,
    /// The broker's processes (`None` when not asked for).
    pub broker: Option<Vec<Reading>>,
    /// The machine's busy ticks.
    pub machine: Option<u64>,
}

/// The CPU seconds between two snapshots, the JSON `cpu stop` writes (`cpu/<label>.json` of the
/// load test, in this order).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Wall-clock seconds between the readings.
    pub wall_s: f64,
    /// The machine's busy CPU seconds (every core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_cpu_s: Option<f64>,
    /// The broker's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_cpu_s: Option<f64>,
    /// PostgreSQL's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_cpu_s: Option<f64>,
    /// The process's (`--pid`), or the command's (`cpu run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_cpu_s: Option<f64>,
}

/// Runs a `cpu` subcommand.
pub fn run(args: CpuArgs) -> Result<()> {
    match args.command {
        CpuCommand::Start(a) => {
            let plan = Plan::new(a.pid, &a.targets);
            let json = serde_json::to_vec(&plan.read())?;
            std::fs::write(&a.state, json).with_context(|| format!("writing {}", a.state.display()))
        }
        CpuCommand::Stop(a) => {
            let text = std::fs::read(&a.state)
                .with_context(|| format!("reading {} (from `cpu start`)", a.state.display()))?;
            let before: Snapshot = serde_json::from_slice(&text)
                .with_context(|| format!("reading {}", a.state.display()))?;
            let after = Plan::again(&before).read();
            write(&figures(&before, &after, None), a.out.as_deref())
        }
        CpuCommand::Run(a) => {
            let plan = Plan::new(None, &a.targets);
            let before = plan.read();
            let (program, rest) = a.command.split_first().context("no command")?;
            let status = std::process::Command::new(program)
                .args(rest)
                .status()
                .with_context(|| format!("starting {program}"))?;
            let after = plan.read();
            write(
                &figures(&before, &after, Some(children_cpu_s())),
                a.out.as_deref(),
            )?;
            if !status.success() {
                bail!("{program} failed: {status}");
            }
            Ok(())
        }
    }
}

fn write(figures: &Figures, out: Option<&Path>) -> Result<()> {
    let json = serde_json::to_string(figures)?;
    match out {
        Some(path) => {
            std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))
        }
        None => {
            println!("{json}");
            Ok(())
        }
    }
}

/// The processes to read: resolved once, at the start.
struct Plan {
    hz: u64,
    process: Option<u32>,
    postgres: Option<u32>,
    broker: Option<Vec<u32>>,
    machine: bool,
}

impl Plan {
    /// The processes of the targets; one that cannot be found is left out (a warning on
    /// stderr): a run is not failed for want of a measurement.
    fn new(pid: Option<u32>, t: &Targets) -> Self {
        let postgres = match (&t.postgres_pid, &t.postgres_data) {
            (Some(pid), _) => Some(*pid),
            (None, Some(dir)) => {
                let pid = postmaster_of_data_dir(dir);
                if pid.is_none() {
                    eprintln!(
                        "cpu: no postmaster.pid readable in {}: PostgreSQL not measured",
                        dir.display()
                    );
                }
                pid
            }
            (None, None) => None,
        };
        let broker = match t.broker.as_deref() {
            None => None,
            Some(b) => match b.parse::<u32>() {
                Ok(pid) => Some(vec![pid]),
                Err(_) => {
                    let pids = pids_named(b);
                    if pids.is_empty() {
                        eprintln!("cpu: no process named {b} is running: the broker not measured");
                        None
                    } else {
                        Some(pids)
                    }
                }
            },
        };
        Self {
            hz: super::clock_ticks_per_s(),
            process: pid,
            postgres,
            broker,
            machine: t.machine,
        }
    }

    /// The plan of a snapshot: the same processes again.
    fn again(s: &Snapshot) -> Self {
        Self {
            hz: s.hz,
            process: s.process.map(|r| r.pid),
            postgres: s.postgres.map(|r| r.pid),
            broker: s.broker.as_ref().map(|b| b.iter().map(|r| r.pid).collect()),
            machine: s.machine.is_some(),
        }
    }

    /// Reads every target now; one that cannot be read is left out (a warning on stderr).
    fn read(&self) -> Snapshot {
        let reading = |what: &str, pid: u32, ticks: Option<u64>| match ticks {
            Some(ticks) => Some(Reading { pid, ticks }),
            None => {
                eprintln!("cpu: {what} (pid {pid}) cannot be read: not running here");
                None
            }
        };
        Snapshot {
            at_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            hz: self.hz,
            process: self
                .process
                .and_then(|p| reading("the process", p, process_ticks(p))),
            postgres: self
                .postgres
                .and_then(|p| reading("PostgreSQL", p, postgres_cpu_ticks(p))),
            broker: self.broker.as_ref().map(|pids| {
                pids.iter()
                    .filter_map(|p| reading("the broker", *p, process_ticks(*p)))
                    .collect()
            }),
            machine: self.machine.then(|| MachineTicks::read().busy),
        }
    }
}

/// The figures from `before` to `after`; `command_cpu_s` is `cpu run`'s command's own.
pub fn figures(before: &Snapshot, after: &Snapshot, command_cpu_s: Option<f64>) -> Figures {
    let s = |a: u64, b: u64| ticks_to_s(b.saturating_sub(a), before.hz);
    let one = |a: Option<Reading>, b: Option<Reading>| match (a, b) {
        (Some(a), Some(b)) if a.pid == b.pid => Some(s(a.ticks, b.ticks)),
        _ => None,
    };
    // The broker: the processes read at both ends (one that ended meanwhile is warned about).
    let broker = before
        .broker
        .as_ref()
        .zip(after.broker.as_ref())
        .map(|(a, b)| {
            a.iter()
                .filter_map(|a| {
                    b.iter()
                        .find(|b| b.pid == a.pid)
                        .map(|b| s(a.ticks, b.ticks))
                })
                .sum()
        });
    Figures {
        wall_s: (after.at_s - before.at_s).max(0.0),
        machine_cpu_s: before.machine.zip(after.machine).map(|(a, b)| s(a, b)),
        broker_cpu_s: broker,
        postgres_cpu_s: one(before.postgres, after.postgres),
        process_cpu_s: command_cpu_s.or_else(|| one(before.process, after.process)),
    }
}

/// User and system seconds of this process's ended and reaped children.
fn children_cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct it is given; a zeroed rusage is a valid value.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

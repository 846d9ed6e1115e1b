//! CPU time read from `/proc`, the one sampler of the toolbox: of one process (its own user and
//! system time), of every process of a name (a broker: `java`, `beam.smp`, `nats-server`), of a
//! PostgreSQL server (the postmaster's own and its reaped children's, plus every live child's),
//! and of the whole machine (`/proc/stat`'s busy time). The `cpu` subcommand
//! ([`sample`]) takes these readings for the scripts.
//!
//! Invariant: tick counts become seconds only through the kernel's clock tick
//! (`sysconf(_SC_CLK_TCK)`), never an assumed 100. A backend that ends moves its time into the
//! postmaster's `cutime`/`cstime`, so the difference of two readings of a server counts every
//! backend that ran in between, whenever it ended (one exiting at the moment of a reading can be
//! missed).

pub mod sample;
#[cfg(test)]
mod tests;

use std::path::Path;

use tokio_postgres::GenericClient;

/// The fields of `/proc/PID/stat` that matter here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The command name (`comm`, at most 15 bytes), without its parentheses.
    pub name: String,
    /// The parent's pid.
    pub ppid: u32,
    /// User ticks of the process.
    pub utime: u64,
    /// System ticks of the process.
    pub stime: u64,
    /// User ticks of its ended and reaped children.
    pub cutime: u64,
    /// System ticks of its ended and reaped children.
    pub cstime: u64,
}

impl Stat {
    /// Parses the text of `/proc/PID/stat`. The name sits between the first `(` and the LAST
    /// `)`: it may hold spaces and parentheses itself.
    pub fn parse(text: &str) -> Option<Self> {
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        let name = text.get(open + 1..close)?.to_owned();
        // After the name: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
        // cmajflt utime stime cutime cstime …
        let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        Some(Self {
            name,
            ppid: u32::try_from(field(1)?).ok()?,
            utime: field(11)?,
            stime: field(12)?,
            cutime: field(13)?,
            cstime: field(14)?,
        })
    }

    /// Reads `/proc/PID/stat`; `None` when the process is gone (or not on this machine).
    pub fn read(pid: u32) -> Option<Self> {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    /// The process's own ticks, user and system.
    pub fn own_ticks(&self) -> u64 {
        self.utime + self.stime
    }
}

/// Clock ticks per second of `/proc` CPU times, from `sysconf(_SC_CLK_TCK)`.
pub fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks)
        .ok()
        .filter(|t| *t > 0)
        .expect("sysconf(_SC_CLK_TCK) names the clock tick on Linux")
}

/// `ticks` in seconds at `hz` ticks per second.
pub fn ticks_to_s(ticks: u64, hz: u64) -> f64 {
    ticks as f64 / hz.max(1) as f64
}

/// `ticks` in seconds at this machine's clock tick.
pub fn seconds(ticks: u64) -> f64 {
    ticks_to_s(ticks, clock_ticks_per_s())
}

/// The pids of `/proc`, each with its stat (processes that end meanwhile are left out).
fn processes() -> Vec<(u32, Stat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, Stat::read(pid)?)))
        .collect()
}

/// Own ticks of process `pid` now (user + system), `None` when it is gone.
pub fn process_ticks(pid: u32) -> Option<u64> {
    Stat::read(pid).map(|s| s.own_ticks())
}

/// The processes whose command name is `name` (compared as the kernel keeps it: its first 15
/// bytes).
pub fn pids_named(name: &str) -> Vec<u32> {
    let wanted = comm_of(name);
    processes()
        .into_iter()
        .filter(|(_, s)| s.name == wanted)
        .map(|(pid, _)| pid)
        .collect()
}

/// A command name as `/proc/PID/stat` shows it: cut to 15 bytes (TASK_COMM_LEN - 1).
pub fn comm_of(name: &str) -> &str {
    let mut end = name.len().min(15);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// The postmaster of data directory `dir`: the first line of its `postmaster.pid`.
pub fn postmaster_of_data_dir(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// CPU ticks of the whole server of `postmaster`: the postmaster's own and its reaped
/// children's (ended backends), plus every live child's (backends, WAL writer, checkpointer, …).
pub fn postgres_cpu_ticks(postmaster: u32) -> Option<u64> {
    let main = Stat::read(postmaster)?;
    let children: u64 = processes()
        .iter()
        .filter(|(pid, s)| s.ppid == postmaster && *pid != postmaster)
        .map(|(_, s)| s.own_ticks())
        .sum();
    Some(main.own_ticks() + main.cutime + main.cstime + children)
}

/// CPU seconds of the whole server of `postmaster` now.
pub fn postgres_cpu_s(postmaster: u32) -> Option<f64> {
    postgres_cpu_ticks(postmaster).map(seconds)
}

/// The postmaster of the server `client` is connected to, when it runs on this machine.
pub async fn postmaster(client: &impl GenericClient) -> Option<u32> {
    let row = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .ok()?;
    let backend: i32 = row.get(0);
    parent_pid(u32::try_from(backend).ok()?)
}

/// The parent of process `pid` when it runs on this machine (the postmaster of a backend).
pub fn parent_pid(pid: u32) -> Option<u32> {
    Stat::read(pid).map(|s| s.ppid).filter(|p| *p > 1)
}

/// CPU seconds this process has used (user + system).
pub fn own_cpu_s() -> f64 {
    process_ticks(std::process::id()).map_or(0.0, seconds)
}

/// The machine's CPU ticks (`/proc/stat`'s `cpu` line, every core).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineTicks {
    /// Busy: user, nice, system, irq, softirq and steal (not idle, not iowait; guest time is
    /// already in user and nice).
    pub busy: u64,
    /// Busy, idle and iowait.
    pub total: u64,
}

impl MachineTicks {
    /// Parses `/proc/stat`'s text.
    pub fn parse(text: &str) -> Option<Self> {
        let line = text.lines().find(|l| l.starts_with("cpu "))?;
        let t: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice]
        let at = |i: usize| t.get(i).copied().unwrap_or(0);
        let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
        Some(Self {
            busy,
            total: busy + at(3) + at(4),
        })
    }

    /// Reads `/proc/stat` now (zero when unavailable).
    pub fn read() -> Self {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    /// The busy share of the machine's CPU time since `before` (0 when no time passed).
    pub fn busy_share_since(&self, before: &MachineTicks) -> f64 {
        let total = self.total.saturating_sub(before.total);
        if total > 0 {
            self.busy.saturating_sub(before.busy) as f64 / total as f64
        } else {
            0.0
        }
    }
}

//! PostgreSQL's CPU time, read from `/proc` when the server runs on this machine: the
//! postmaster's own and its reaped children's (ended backends), plus every live child's
//! (backends, WAL writer, checkpointer, …). A backend that ends moves its time into the
//! postmaster's `cutime`/`cstime`, so the difference of two readings counts every backend that ran
//! in between, whenever it ended (one that is exiting at the moment of a reading can be missed).

use tokio_postgres::GenericClient;

/// The postmaster of the server `client` is connected to, when it runs on this machine.
pub async fn postmaster(client: &impl GenericClient) -> Option<u32> {
    let row = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .ok()?;
    let backend: i32 = row.get(0);
    parent_pid(u32::try_from(backend).ok()?)
}

/// CPU seconds of the whole server of `postmaster` now.
pub fn postgres_cpu_s(postmaster: u32) -> Option<f64> {
    postgres_cpu_ticks(postmaster).map(|t| t as f64 / clock_ticks_per_s())
}

/// CPU ticks of the whole server: the postmaster's own and its reaped children's (ended
/// backends), plus every live child's (backends, WAL writer, checkpointer, …).
pub fn postgres_cpu_ticks(postmaster: u32) -> Option<u64> {
    let main = Stat::read(postmaster)?;
    let mut ticks = main.utime + main.stime + main.cutime + main.cstime;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(child) = Stat::read(pid).filter(|s| s.ppid == postmaster) {
            ticks += child.utime + child.stime;
        }
    }
    Some(ticks)
}

/// The parent of process `pid` when it runs on this machine (the postmaster of a backend).
pub fn parent_pid(pid: u32) -> Option<u32> {
    Stat::read(pid).map(|s| s.ppid).filter(|p| *p > 1)
}

/// The fields of `/proc/PID/stat` that matter here.
struct Stat {
    ppid: u32,
    utime: u64,
    stime: u64,
    cutime: u64,
    cstime: u64,
}

impl Stat {
    fn read(pid: u32) -> Option<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may hold spaces and parentheses: the fields start after the last ')'.
        let rest = &text[text.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        Some(Self {
            ppid: field(1)? as u32,
            utime: field(11)?,
            stime: field(12)?,
            cutime: field(13)?,
            cstime: field(14)?,
        })
    }
}

/// Clock ticks per second of `/proc` CPU times.
pub fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// CPU seconds this process has used (user + system).
pub fn own_cpu_s() -> f64 {
    let stat = Stat::read(std::process::id());
    stat.map_or(0.0, |s| (s.utime + s.stime) as f64 / clock_ticks_per_s())
}

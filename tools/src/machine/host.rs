//! The machine's facts, from the kernel (`/proc`, `sysconf`), and the UTC time reports are
//! stamped with.

use anyhow::{Context, Result};

/// What a report says of the machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// Processors online.
    pub cores: u64,
    /// `MemTotal` in GiB, to 0.1.
    pub memory_gib: f64,
    /// The kernel's release (`uname -r`).
    pub kernel: String,
}

impl Facts {
    /// Reads them now.
    pub fn read() -> Result<Self> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
        let kib = mem_total_kib(&meminfo).context("no MemTotal in /proc/meminfo")?;
        Ok(Self {
            cores: cores(),
            memory_gib: round(kib as f64 / 1_048_576.0, 1),
            kernel: kernel(),
        })
    }
}

/// Processors online (`sysconf(_SC_NPROCESSORS_ONLN)`), at least 1.
pub fn cores() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u64::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1)
}

/// The kernel's release, `""` when unreadable.
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The first CPU's model name (`/proc/cpuinfo`), `""` when there is none.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| model_name(&t))
        .unwrap_or_default()
}

/// The 1, 5 and 15 minute load averages as `/proc/loadavg` writes them.
pub fn load_average() -> Vec<String> {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// `MemTotal` of `/proc/meminfo`'s text, in kB.
pub fn mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The first `model name` of `/proc/cpuinfo`'s text.
pub fn model_name(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

/// `x` rounded to `digits` decimals.
pub fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// Now, UTC, to the minute: `2026-12-01 14:29`.
pub fn utc_now_minutes() -> String {
    utc_minutes(now_s())
}

/// Seconds since the Unix epoch.
pub fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `secs` since the Unix epoch, UTC, to the minute: `YYYY-MM-DD HH:MM`.
pub fn utc_minutes(secs: i64) -> String {
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (H. Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    // d is 1..=31 and m 1..=12 by construction.
    (y, m as u32, d as u32)
}

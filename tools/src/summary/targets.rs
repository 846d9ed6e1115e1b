//! The targets of the load test, each MET, MISSED with its gap, or not measured.

use super::cpu::{postgres_us_per_record, Samples};
use super::sections::{drain_at, Replay};
use super::{batching, best, best_rate, gap, int, is_drain, is_floor, ms, trusted, verdict};
use crate::report::RunReport;

/// What the targets are judged on.
pub(super) struct Facts<'a> {
    pub(super) runs: &'a [RunReport],
    pub(super) samples: &'a Samples,
    pub(super) replays: &'a [Replay],
    /// Records in the main input.
    pub(super) messages: Option<u64>,
    /// The processor's default batching (`linger` or `natural`), when the load test recorded it.
    pub(super) default_batching: Option<&'a str>,
}

/// Targets: throughput ≥ 35× per-message (≥ 30× for any input of ≥ 40,000), ≥ 200,000 msgs/s,
/// PostgreSQL ≤ 7 µs per record, ≥ 90% of the replay; latency p99 ≤ linger + 50 ms at a share of
/// the best throughput and ≤ 25 ms for light traffic with the defaults; ≤ 200 MiB on the backlog.
const RATIO: f64 = 35.0;
const RATIO_ANY_RUN: f64 = 30.0;
const ANY_RUN_MESSAGES: u64 = 40_000;
const RATE: f64 = 200_000.0;
const PG_US: f64 = 7.0;
const OF_REPLAY: f64 = 90.0;
const LIGHT_P99_MS: f64 = 25.0;
const MEMORY_MIB: f64 = 200.0;

pub(super) fn section(f: &Facts<'_>) -> String {
    let mut md = String::from("\n## Targets\n\n");
    let base = best_rate(f.runs, "per-message");
    let top = best(f.runs, |r| r.label.starts_with("batched-"));
    let lines = [
        ratio(top, base, f.messages),
        rate(top),
        postgres(top, f.samples),
        replay(f.runs, top, f.replays),
        copy(top, best_rate(f.runs, "copy")),
        latency(f.runs),
        light(f.runs, f.default_batching),
        memory(f.runs),
    ];
    for line in lines {
        md.push_str(&format!("- {line}\n"));
    }
    for r in f.runs.iter().filter(|r| !trusted(r)) {
        let label = &r.label;
        md.push_str(&format!(
            "- **FAILED RUN** `{label}`: verification failed; not counted toward the targets.\n"
        ));
    }
    md
}

fn ratio(top: Option<&RunReport>, base: Option<f64>, messages: Option<u64>) -> String {
    let name = format!("(1a) best batched run ≥ {RATIO}× per-message msgs/s in the same run");
    let (Some(r), Some(base)) = (top, base) else {
        return format!("{name}: not measured");
    };
    let x = r.msgs_per_sec / base;
    let g = gap(x, RATIO, true, |d| format!("{d:.1}×"));
    let (label, v, b) = (&r.label, int(r.msgs_per_sec), int(base));
    let mut out = format!(
        "{name}: {} — `{label}` {v} msgs/s = {x:.1}× per-message ({b} msgs/s); {g}",
        verdict(x >= RATIO)
    );
    let n = messages.unwrap_or(0);
    if n >= ANY_RUN_MESSAGES {
        out.push_str(&format!(
            "\n- (1b) a run of ≥ {} messages stays ≥ {RATIO_ANY_RUN}×: {} — this run has {} \
             messages and reaches {x:.1}×",
            int(ANY_RUN_MESSAGES as f64),
            verdict(x >= RATIO_ANY_RUN),
            int(n as f64)
        ));
    }
    out
}

fn rate(top: Option<&RunReport>) -> String {
    let name = format!("(1c) ≥ {} msgs/s end to end", int(RATE));
    let Some(r) = top else {
        return format!("{name}: not measured");
    };
    let g = gap(r.msgs_per_sec, RATE, true, |d| format!("{} msgs/s", int(d)));
    let (met, label, v) = (
        verdict(r.msgs_per_sec >= RATE),
        &r.label,
        int(r.msgs_per_sec),
    );
    format!("{name}: {met} — `{label}` {v} msgs/s; {g}")
}

fn postgres(top: Option<&RunReport>, samples: &Samples) -> String {
    let name = format!("(1d) PostgreSQL CPU ≤ {PG_US} µs per record");
    let Some((r, us)) = top.and_then(|r| Some((r, postgres_us_per_record(samples, r)?))) else {
        return format!("{name}: not measured");
    };
    let g = gap(us, PG_US, false, |d| format!("{d:.2} µs"));
    format!(
        "{name}: {} — `{}` {us:.2} µs; {g}",
        verdict(us <= PG_US),
        r.label
    )
}

fn replay(runs: &[RunReport], top: Option<&RunReport>, replays: &[Replay]) -> String {
    let name = format!("(2) end to end ≥ {OF_REPLAY}% of the database-only replay");
    let size = top.map(|r| r.settings.batch_size);
    let same = replays
        .iter()
        .find(|p| p.usable() && Some(p.batch_size) == size);
    let pair = same.and_then(|p| Some((drain_at(runs, p.batch_size)?, p)));
    let Some((r, p)) = pair else {
        return format!("{name}: not measured");
    };
    let share = r.msgs_per_sec / p.records_per_s * 100.0;
    let g = gap(share, OF_REPLAY, true, |d| format!("{d:.1} pp"));
    let (v, pv) = (int(r.msgs_per_sec), int(p.records_per_s));
    format!(
        "{name}: {} — `{}` {v} msgs/s = {share:.1}% of `{}` {pv} records/s; {g}",
        verdict(share >= OF_REPLAY),
        r.label,
        p.label
    )
}

fn copy(top: Option<&RunReport>, copy: Option<f64>) -> String {
    let name = "(2) the COPY ceiling (raw floor, no target)";
    let (Some(r), Some(c)) = (top, copy) else {
        return format!("{name}: not measured");
    };
    let share = r.msgs_per_sec / c * 100.0;
    format!(
        "{name}: `{}` reaches {share:.1}% of COPY's {} ids/s",
        r.label,
        int(c)
    )
}

/// Fixed-rate runs of the processor (not the floors, not light traffic).
fn loaded(runs: &[RunReport]) -> impl Iterator<Item = &RunReport> {
    let keep = |r: &&RunReport| !is_drain(r) && !is_floor(r) && trusted(r);
    runs.iter()
        .filter(keep)
        .filter(|r| r.label.starts_with("latency"))
}

fn latency(runs: &[RunReport]) -> String {
    let name = "(3a) p99 ≤ linger + 50 ms at 25% and 50% of the best throughput";
    let fixed: Vec<&RunReport> = loaded(runs).collect();
    if fixed.is_empty() {
        return format!("{name}: not measured");
    }
    let bound = |r: &RunReport| r.settings.linger_ms as f64 + 50.0;
    let met = |r: &RunReport| r.e2e_latency_ms.count > 0 && r.e2e_latency_ms.p99 <= bound(r);
    let mut out = format!("{name}: {}", verdict(fixed.iter().all(|r| met(r))));
    for r in fixed {
        let (label, p99, b) = (&r.label, r.e2e_latency_ms.p99, bound(r));
        let g = gap(p99, b, false, |d| format!("{} ms", ms(d)));
        let (v, p99, b) = (verdict(met(r)), ms(p99), ms(b));
        let how = batching(r);
        out.push_str(&format!(
            "\n  - `{label}` ({how}): {v} p99 {p99} ms, bound {b} ms; {g}"
        ));
    }
    out
}

fn light(runs: &[RunReport], default: Option<&str>) -> String {
    let name = format!("(3b) p99 ≤ {LIGHT_P99_MS} ms at light traffic with the default settings");
    let keep = |r: &&RunReport| r.label.starts_with("light-") && trusted(r);
    let light: Vec<&RunReport> = runs.iter().filter(keep).collect();
    if light.is_empty() {
        return format!("{name}: not measured");
    }
    let met = |r: &RunReport| r.e2e_latency_ms.count > 0 && r.e2e_latency_ms.p99 <= LIGHT_P99_MS;
    let is_default = |r: &&&RunReport| default.is_some_and(|d| batching(r) == d);
    let judged: Vec<&&RunReport> = light.iter().filter(is_default).collect();
    if judged.is_empty() {
        out_of_defaults(&name, &light, met)
    } else {
        let mut out = format!("{name}: {}", verdict(judged.iter().all(|r| met(r))));
        let d = default.unwrap_or_default();
        out.push_str(&format!(" (judged on the default batching, {d})"));
        light_lines(out, &light, met)
    }
}

/// Without a recorded default: met when one batching meets it.
fn out_of_defaults(name: &str, light: &[&RunReport], met: impl Fn(&RunReport) -> bool) -> String {
    let mut out = format!("{name}: {}", verdict(light.iter().any(|r| met(r))));
    out.push_str(" (met when one batching meets it; the default is not recorded)");
    light_lines(out, light, met)
}

fn light_lines(mut out: String, light: &[&RunReport], met: impl Fn(&RunReport) -> bool) -> String {
    for r in light {
        let p99 = r.e2e_latency_ms.p99;
        let g = gap(p99, LIGHT_P99_MS, false, |d| format!("{} ms", ms(d)));
        let rate = r
            .input_rate
            .map_or(String::new(), |v| format!(" at {} msgs/s", int(v)));
        out.push_str(&format!(
            "\n  - `{}` ({}{rate}): {} p99 {} ms; {g}",
            r.label,
            batching(r),
            verdict(met(r)),
            ms(p99)
        ));
    }
    out
}

fn memory(runs: &[RunReport]) -> String {
    let name = format!("(4) backlog-1m run's peak RSS ≤ {MEMORY_MIB} MiB");
    let keep = |r: &&RunReport| r.label.starts_with("backlog-1m") && trusted(r);
    let mem: Vec<&RunReport> = runs.iter().filter(keep).collect();
    if mem.is_empty() {
        return format!("{name}: not measured");
    }
    let part = |r: &&RunReport| {
        let g = gap(r.peak_rss_mb, MEMORY_MIB, false, |d| format!("{d:.1} MiB"));
        format!("`{}` {:.1} MiB; {g}", r.label, r.peak_rss_mb)
    };
    let parts: Vec<String> = mem.iter().map(part).collect();
    let met = verdict(mem.iter().all(|r| r.peak_rss_mb <= MEMORY_MIB));
    format!("{name}: {met} — {}", parts.join("; "))
}

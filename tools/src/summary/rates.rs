//! "The default at every rate": the default settings (natural batching, batch 1000, no minimum
//! wait) at fixed input rates (`default-r<rate>` runs), each beside the consume-only floor at the
//! same rate and the per-message backlog drain: how big natural batches get, what a record
//! costs in CPU (processor, broker, PostgreSQL), and the latency added over the floor.

use super::cpu::{CpuSample, Samples};
use super::{header, ms, row, DASH};
use crate::report::RunReport;

const HEAD: &str = concat!(
    "rate msgs/s|mean batch|processor µs/rec|broker µs/rec|PostgreSQL µs/rec|",
    "sum µs/rec|per-message sum µs/rec|p50 ms|p99 ms|floor receive p99 ms|added p99 ms|verified"
);

/// Whether `r` is a run of the default settings at a fixed rate.
pub(super) fn is_default_rate(r: &RunReport) -> bool {
    r.label.starts_with("default-r") && r.input_rate.is_some()
}

/// The CPU of `r` per record, in µs: processor, broker, PostgreSQL.
fn per_record(r: &RunReport, s: &CpuSample) -> [f64; 3] {
    let records = r.stats.records.max(1) as f64;
    let pg = r.postgres_cpu_s.or(s.postgres_cpu_s).unwrap_or(0.0);
    [r.cpu_s, s.broker_cpu_s, pg].map(|v| v / records * 1e6)
}

/// The section, or an empty string without `default-r<rate>` runs.
pub(super) fn section(runs: &[RunReport], samples: &Samples) -> String {
    let mut rated: Vec<&RunReport> = runs.iter().filter(|r| is_default_rate(r)).collect();
    if rated.is_empty() {
        return String::new();
    }
    rated.sort_by(|a, b| {
        a.input_rate
            .partial_cmp(&b.input_rate)
            .expect("rates are numbers")
    });
    let sum_of = |r: &RunReport| Some(per_record(r, samples.get(&r.label)?).iter().sum::<f64>());
    let drain = runs
        .iter()
        .find(|r| r.settings.mode == "per-message" && super::is_main_drain(r))
        .and_then(sum_of);
    // The per-message run at the same rate when there is one (the baseline keeps up with low
    // rates only), else the per-message backlog drain.
    let baseline = |r: &RunReport| {
        let label = r.label.replace("default-r", "permessage-r");
        match runs.iter().find(|p| p.label == label) {
            Some(p) => sum_of(p).map(|v| format!("{v:.1}")),
            None => drain.map(|v| format!("{v:.1} (drain)")),
        }
        .unwrap_or_else(|| DASH.into())
    };
    let mut md = String::from("\n## The default at every rate\n\n");
    md.push_str(
        "The default settings (natural batching, batch 1000, no minimum wait) at fixed input \
         rates, after a warm-up. Mean batch: records per transaction. CPU per record while the \
         input flows: the processor's, the broker's and PostgreSQL's processes' (at low rates \
         their idle work is spread over few records); the per-message sum is that of the \
         per-message run at the same rate (`permessage-r<rate>`), or of the per-message backlog \
         drain where the baseline cannot keep up with the rate. Added p99: end-to-end p99 less \
         the receive p99 of the consume-only run at the same rate (`floor-r<rate>`).\n",
    );
    header(&mut md, HEAD);
    for r in rated {
        let cpu = samples.get(&r.label).map(|s| per_record(r, s));
        let us = |v: Option<f64>| v.map_or(DASH.into(), |v| format!("{v:.1}"));
        let floor = super::floor_of(runs, r).map(|f| f.receive_latency_ms.p99);
        let transactions = r.stats.transactions.max(1) as f64;
        row(
            &mut md,
            &[
                format!("{:.0}", r.input_rate.unwrap_or(0.0)),
                format!("{:.1}", r.stats.records as f64 / transactions),
                us(cpu.map(|c| c[0])),
                us(cpu.map(|c| c[1])),
                us(cpu.map(|c| c[2])),
                us(cpu.map(|c| c.iter().sum())),
                baseline(r),
                ms(r.e2e_latency_ms.p50),
                ms(r.e2e_latency_ms.p99),
                floor.map_or(DASH.into(), ms),
                floor.map_or(DASH.into(), |f| ms(r.e2e_latency_ms.p99 - f)),
                match r.verified {
                    Some(true) => "yes".into(),
                    Some(false) => "**NO**".into(),
                    None => DASH.into(),
                },
            ],
        );
    }
    md
}

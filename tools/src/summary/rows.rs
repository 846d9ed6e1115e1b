//! The rows of the throughput, SQL-handler and latency tables, one run per row.

use super::*;

pub(super) fn throughput_row(
    r: &RunReport,
    base: Option<f64>,
    copy: Option<f64>,
    consume: Option<f64>,
) -> Vec<String> {
    let (db, e) = (r.settings.mode != "copy", &r.e2e_latency_ms);
    let lat = |v: f64| or_dash(db && e.count > 0, ms(v));
    let ratio =
        |b: Option<f64>, f: fn(f64) -> String| b.map_or(DASH.into(), |b| f(r.msgs_per_sec / b));
    let stmts = r
        .statements_per_msg
        .map_or("n/a".into(), |s| format!("{s:.3}"));
    let verified = r.verified.map_or(DASH, |v| if v { "yes" } else { "no" });
    vec![
        cell(&r.label),
        cell(&r.settings.mode),
        batch_cell(r),
        int(r.msgs_per_sec),
        ratio(base, |x| format!("{x:.1}×")),
        ratio(copy, |x| format!("{:.1}%", x * 100.0)),
        ratio(consume, |x| format!("{:.1}%", x * 100.0)),
        lat(e.p50),
        lat(e.p99),
        lat(e.p999),
        or_dash(db, stmts),
        or_dash(db, int(r.stats.transactions as f64)),
        or_dash(db, format!("{:.1}", r.peak_rss_mb)),
        verified.into(),
    ]
}

/// The SQL handler's drains next to the Rust ledger's drain of the same mode (and batch size).
pub(super) fn sql_handler(md: &mut String, runs: &[RunReport]) {
    let sql: Vec<&RunReport> = runs.iter().filter(|r| is_drain(r) && is_sql(r)).collect();
    if sql.is_empty() {
        return;
    }
    md.push_str("\n## SQL handler vs the Rust ledger\n\n");
    md.push_str("The same input drained by `run --handler sql --apply-sql ");
    md.push_str("examples/sql/balances_upsert.sql` (one aggregate upsert per batch, no overdraft ");
    md.push_str("rule) and by the Rust ledger, in the same mode and batch size.\n");
    header(md, SQL_HEAD);
    for r in sql {
        let per_message = r.settings.mode == "per-message";
        let peer = best(runs, |l| {
            !is_sql(l)
                && !l.label.contains("natural")
                && l.settings.mode == r.settings.mode
                && (per_message || l.settings.batch_size == r.settings.batch_size)
        });
        let verified = r.verified.map_or(DASH, |v| if v { "yes" } else { "no" });
        row(
            md,
            &[
                cell(&r.label),
                cell(&r.settings.mode),
                batch_cell(r),
                int(r.msgs_per_sec),
                peer.map_or(DASH.into(), |l| cell(&l.label)),
                peer.map_or(DASH.into(), |l| int(l.msgs_per_sec)),
                peer.filter(|l| l.msgs_per_sec > 0.0)
                    .map_or(DASH.into(), |l| {
                        format!("{:.2}×", r.msgs_per_sec / l.msgs_per_sec)
                    }),
                verified.into(),
            ],
        );
    }
}

pub(super) fn latency_row(r: &RunReport, floor: Option<&RunReport>) -> Vec<String> {
    let e = &r.e2e_latency_ms;
    let mut cells = vec![
        cell(&r.label),
        if is_floor(r) { DASH } else { batching(r) }.into(),
        batch_cell(r),
        r.settings.linger_ms.to_string(),
    ];
    cells.push(r.input_rate.map_or(DASH.into(), int));
    cells.extend([e.p50, e.p90, e.p99, e.p999, e.max].map(ms));
    let measured = |p: &batch_inbox::stats_file::Percentiles| or_dash(p.count > 0, ms(p.p99));
    cells.push(r.acked_ms.as_ref().map_or(DASH.into(), measured));
    cells.push(measured(&r.receive_latency_ms));
    cells.push(measured(&r.in_batch_ms));
    let stage = |s: &&str| r.stages_ms.get(*s).map_or(DASH.into(), |p| ms(p.p99));
    cells.extend(STAGES.iter().map(stage));
    match floor.filter(|_| !is_floor(r)) {
        Some(f) => {
            cells.push(measured(&f.receive_latency_ms));
            cells.push(ms(f.e2e_latency_ms.p99));
            cells.push(ms(e.p99 - f.receive_latency_ms.p99));
        }
        None => cells.extend([DASH, DASH, DASH].map(String::from)),
    }
    cells
}

use super::*;

#[test]
fn writes_the_summary_and_the_plots() {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let name = format!(
        "batch-inbox-summary-{}-{}",
        std::process::id(),
        t.unwrap().as_nanos()
    );
    let dir = std::env::temp_dir().join(name);
    let (input, output) = (dir.join("in"), dir.join("out"));
    fs::create_dir_all(input.join("runs")).unwrap();
    fs::write(
        input.join("machine.json"),
        r#"{"cores": 2, "broker": "redpanda", "messages": 1000000}"#,
    )
    .unwrap();
    let runs = [
        ("per-message", "per-message", 1, None, 1_000.0),
        ("batched-b1000", "batched", 1000, None, 36_000.0),
        ("batched-b2000", "batched", 2000, None, 90_000.0), // fails verification
        ("copy", "copy", 0, None, 100_000.0),
        ("latency-b500-r25", "batched", 500, Some(5_000.0), 5_000.0),
        ("floor-r5000", "consume-only", 1000, Some(5_000.0), 5_000.0),
        ("light-linger-r100", "batched", 1000, Some(100.0), 100.0),
        ("scale-p2", "batched", 1000, None, 30_000.0),
        ("remote-2ms-per-message", "per-message", 1000, None, 200.0),
        ("remote-2ms-batched-b1000", "batched", 1000, None, 20_000.0),
        // Faster than the ledger here: never the target's run, nor a reference rate.
        ("sql-batched", "batched", 1000, None, 42_000.0),
        ("sql-per-message", "per-message", 1, None, 2_000.0),
    ];
    for (i, (label, mode, batch_size, rate, msgs_per_sec)) in runs.into_iter().enumerate() {
        let mut r = RunReport {
            label: label.into(),
            ..RunReport::default()
        };
        r.msgs_per_sec = msgs_per_sec;
        (r.settings.mode, r.settings.batch_size) = (mode.into(), batch_size);
        (r.input_rate, r.settings.linger_ms) = (rate, 20);
        r.verified = Some(label != "batched-b2000");
        if label.starts_with("sql-") {
            r.settings.handler = "sql".into();
        }
        (r.stats.records, r.cpu_s) = (1_000_000, 3.0);
        let e2e = &mut r.e2e_latency_ms;
        (e2e.count, e2e.p50, e2e.p99, e2e.p999) = (100, 5.0, 60.0, 90.0);
        let receive = &mut r.receive_latency_ms;
        (receive.count, receive.p99) = (100, 8.0);
        r.e2e_distribution_ms = vec![[50.0, 5.0], [99.0, 60.0], [99.9, 90.0]];
        if rate.is_some() {
            r.acked_ms = Some(batch_inbox::stats_file::Percentiles {
                count: 100,
                p99: 4.0,
                ..batch_inbox::stats_file::Percentiles::default()
            });
        }
        let json = serde_json::to_vec(&r).unwrap();
        fs::write(input.join(format!("runs/{i}.json")), json).unwrap();
    }
    fs::create_dir_all(input.join("cpu")).unwrap();
    let sample = r#"{"wall_s": 10.0, "machine_cpu_s": 18.0, "broker_cpu_s": 5.0,
        "postgres_cpu_s": 6.5}"#;
    fs::write(input.join("cpu/batched-b1000.json"), sample).unwrap();
    let replay = r#"{"label": "replay-b1000", "mode": "batched", "batch_size": 1000,
        "records_per_s": 40000.0, "pg_cpu_us_per_record": 6.1, "differences": []}"#;
    fs::write(input.join("replay.jsonl"), replay.replace('\n', "")).unwrap();
    let written = write(&input, &output).unwrap();
    let md = fs::read_to_string(&written[0]).unwrap();
    for want in [
        "| batched-b1000 | 10.0 | 90% | 3.0 | 5.0 | 6.5 | 3.5 | 18.0 | 3.0 | 6.5 |",
        "| cores | 2 |",
        "| broker | redpanda |",
        "| batched-b1000 | batched | 1000 | 36,000 | 36.0× | 36.0% | — | 5.00 | 60.00 | 90.00 |",
        "≥ 35× per-message msgs/s in the same run: **MET** — `batched-b1000` 36,000 msgs/s",
        "stays ≥ 30×: **MET** — this run has 1,000,000 messages",
        "≥ 200,000 msgs/s end to end: **MISSED** — `batched-b1000` 36,000 msgs/s; gap 164,000",
        "≤ 7 µs per record: **MET** — `batched-b1000` 6.50 µs; margin 0.50 µs",
        "= 90.0% of `replay-b1000` 40,000 records/s; margin 0.0 pp",
        "| replay-b1000 | 1000 | 40,000 | 6.10 | yes | 36,000 | 90.0% |",
        "| latency-b500-r25 | linger | 500 | 20 | 5,000 | 5.00 | 0.00 | 60.00 | 90.00 | 0.00 | 4.00 | 8.00 | — | — | — | — | 8.00 | 60.00 | 52.00 |",
        "- `latency-b500-r25` (linger): **MET** p99 60.00 ms, bound 70.00 ms; margin 10.00 ms",
        "- `light-linger-r100` (linger at 100 msgs/s): **MISSED** p99 60.00 ms; gap 35.00 ms",
        "| scale-p2 | 2 | 1000 | 1,000,000 | 30,000 |",
        "| 2 | 200 | 20,000 | 1000 | 100.0× | yes |",
        "| sql-batched | batched | 1000 | 42,000 | batched-b1000 | 36,000 | 1.17× | yes |",
        "| sql-per-message | per-message | 1 | 2,000 | per-message | 1,000 | 2.00× | yes |",
        "| sql-batched | batched | 1000 | 42,000 | 42.0× |",
        "peak RSS ≤ 200 MiB: not measured",
        "**FAILED RUN** `batched-b2000`",
    ] {
        assert!(md.contains(want), "missing {want:?} in\n{md}");
    }
    assert!(!md.contains("| floor-r5000 | consume-only"), "{md}");
    assert_eq!(written.len(), 4);
    for svg in &written[1..] {
        assert!(
            fs::read_to_string(svg).unwrap().starts_with("<svg"),
            "{svg:?}"
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_input_names_the_file() {
    let dir = std::env::temp_dir().join(format!("batch-inbox-none-{}", std::process::id()));
    let err = write(&dir, &dir.join("out")).unwrap_err();
    assert!(matches!(&err, SummaryError::Io { path, .. } if path.ends_with("machine.json")));
}

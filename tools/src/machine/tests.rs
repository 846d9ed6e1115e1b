use super::host::*;
use super::*;
use serde_json::json;

#[test]
fn params_are_numbers_and_booleans_when_they_read_as_one() {
    assert_eq!(
        parse_param("messages=40000"),
        Ok(("messages".into(), json!(40000)))
    );
    assert_eq!(parse_param("ratio=0.1"), Ok(("ratio".into(), json!(0.1))));
    assert_eq!(parse_param("quick=true"), Ok(("quick".into(), json!(true))));
    assert_eq!(
        parse_param("broker=Apache Kafka 4.4.0 (one KRaft node)"),
        Ok((
            "broker".into(),
            json!("Apache Kafka 4.4.0 (one KRaft node)")
        ))
    );
    assert_eq!(parse_param("b=natural"), Ok(("b".into(), json!("natural"))));
    assert_eq!(parse_param("e="), Ok(("e".into(), json!(""))));
    assert_eq!(parse_param("k=a=b"), Ok(("k".into(), json!("a=b"))));
    assert!(parse_param("novalue").is_err());
    assert!(parse_param("=1").is_err());
}

fn server() -> Server {
    Server {
        version: "15.18 (Debian 15.18-0+deb12u1)".into(),
        synchronous_commit: "on".into(),
        fsync: "on".into(),
        fdatasync_ops_per_s: Some(8245.837),
    }
}

fn facts() -> Facts {
    Facts {
        cores: 2,
        memory_gib: 23.5,
        kernel: "6.18.44-fc-v669".into(),
    }
}

/// The committed file's top-level entries in their order: key, and the value as a script
/// passes it (a string without its quotes).
fn entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("  \""))
        .map(|l| {
            let (key, value) = l.split_once("\": ").unwrap();
            let value = value.trim_end_matches(',');
            let value = match serde_json::from_str::<Value>(value).unwrap() {
                Value::String(s) => s,
                _ => value.to_owned(),
            };
            (key.to_owned(), value)
        })
        .collect()
}

#[test]
fn the_committed_machine_json_is_rebuilt_byte_for_byte_from_its_facts_and_params() {
    let committed = include_str!("../../../results/loadtest/machine.json");
    let entries = entries(committed);
    let v: Value = serde_json::from_str(committed).unwrap();
    let facts = Facts {
        cores: v["cores"].as_u64().unwrap(),
        memory_gib: v["memory_gib"].as_f64().unwrap(),
        kernel: v["kernel"].as_str().unwrap().into(),
    };
    let server = Server {
        version: v["postgres_version"].as_str().unwrap().into(),
        synchronous_commit: v["synchronous_commit"].as_str().unwrap().into(),
        fsync: v["fsync"].as_str().unwrap().into(),
        fdatasync_ops_per_s: v["pg_test_fsync_fdatasync_ops_per_s"].as_f64(),
    };
    let date = v["date"].as_str().unwrap().strip_suffix(" UTC").unwrap();
    // The script's --param flags: every entry after the eight facts.
    let params: Vec<_> = entries[8..]
        .iter()
        .map(|(k, v)| parse_param(&format!("{k}={v}")).unwrap())
        .collect();
    assert!(params.len() > 5);
    let doc = document(date.into(), &facts, &server, &params).unwrap();
    let text = String::from_utf8(serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    assert_eq!(text, committed);
}

#[test]
fn a_param_cannot_replace_a_fact_and_a_missing_rate_is_null() {
    let err = document(
        "2026-12-01 14:29".into(),
        &facts(),
        &server(),
        &[("cores".into(), json!(64))],
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("cores"), "{err:#}");
    let none = Server {
        fdatasync_ops_per_s: None,
        ..server()
    };
    let doc = document("d".into(), &facts(), &none, &[]).unwrap();
    let v = serde_json::to_value(&doc).unwrap();
    assert_eq!(v["pg_test_fsync_fdatasync_ops_per_s"], json!(null));
    assert_eq!(v["date"], json!("d UTC"));
}

#[test]
fn pg_test_fsync_s_fdatasync_line_gives_the_rate() {
    let out = "Compare file sync methods using one 8kB write:
(in wal_sync_method preference order, except fdatasync is Linux's default)
        open_datasync                      7996.245 ops/sec     125 usecs/op
        fdatasync                          8245.837 ops/sec     121 usecs/op
        fsync                              3000.000 ops/sec     333 usecs/op

Compare file sync methods using two 8kB writes:
        fdatasync                          4000.000 ops/sec     250 usecs/op
";
    assert_eq!(fdatasync_rate(out), Some(8245.837));
    assert_eq!(fdatasync_rate("fdatasync   n/a*\n"), None);
    assert_eq!(fdatasync_rate(""), None);
}

#[test]
fn the_newest_postgresql_s_tool_is_found_by_version_number() {
    let root = std::env::temp_dir().join(format!("pg-tools-{}", std::process::id()));
    for v in ["9.6", "15", "13", "notaversion"] {
        let bin = root.join(v).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("pg_test_fsync"), "").unwrap();
    }
    std::fs::create_dir_all(root.join("16").join("bin")).unwrap();
    assert_eq!(
        newest_pg_tool(&root, "pg_test_fsync"),
        Some(root.join("15").join("bin").join("pg_test_fsync"))
    );
    assert_eq!(newest_pg_tool(&root, "initdb"), None);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn dates_are_utc_to_the_minute() {
    assert_eq!(utc_minutes(0), "1970-01-01 00:00");
    // 2026-12-01 14:29:59 UTC.
    assert_eq!(utc_minutes(1_796_135_399), "2026-12-01 14:29");
    assert_eq!(utc_minutes(951_782_400), "2000-02-29 00:00");
    assert_eq!(utc_minutes(-60), "1969-12-31 23:59");
    assert_eq!(civil_from_days(19_723), (2024, 1, 1));
}

#[test]
fn meminfo_and_cpuinfo_give_memory_and_model() {
    let meminfo = "MemTotal:       24641536 kB\nMemFree:         1000 kB\n";
    assert_eq!(mem_total_kib(meminfo), Some(24_641_536));
    assert_eq!(round(24_641_536.0 / 1_048_576.0, 1), 23.5);
    assert_eq!(mem_total_kib("MemFree: 3 kB\n"), None);
    let cpuinfo =
        "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nprocessor\t: 1\nmodel name\t: other\n";
    assert_eq!(model_name(cpuinfo), Some("AMD EPYC 9B14".into()));
    assert_eq!(model_name(""), None);
}

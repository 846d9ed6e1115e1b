//! Tests of the topic dump's parsing, the record-by-record check, the log's counts, and the
//! reports against the committed ones.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;
use uuid::Uuid;

use super::check::*;
use super::report::*;

const A: &str = "0190a8f0-0000-7000-8000-000000000001";
const B: &str = "0190a8f0-0000-7000-8000-000000000002";
const C: &str = "0190a8f0-0000-7000-8000-000000000003";

fn id(s: &str) -> Uuid {
    Uuid::parse_str(s).unwrap()
}

fn line(p: i64, o: i64, headers: &str, value: &str) -> String {
    format!("Partition:{p}\tOffset:{o}\t{headers}\tkey-{o}\t{value}\n")
}

#[test]
fn console_consumer_lines_become_records() {
    let dump = [
        line(0, 0, &format!("id:{A}"), r#"{"account_id":1,"amount":5}"#),
        line(0, 1, "NO_HEADERS", r#"{"account_id":1,"amount":5}"#),
        line(1, 0, &format!("x:1,id: {B} "), "NULL"),
        // A value may hold tabs: it is the rest of the line.
        line(
            1,
            1,
            &format!("id:{C}"),
            "{\"account_id\":\t2,\"amount\":-3}",
        ),
        "Processed a total of 4 messages\n".to_owned(),
        "Partition:x\tOffset:1\ta\tb\tc\n".to_owned(),
        "Partition:2\tOffset:3\tonly-headers\n".to_owned(),
    ]
    .concat();
    let r = read_topic(&dump);
    assert_eq!(r.len(), 4);
    assert_eq!(
        r[&(0, 0)],
        TopicRecord {
            id: Some(id(A)),
            entry: Some((1, 5))
        }
    );
    assert_eq!(r[&(0, 1)].id, None);
    assert_eq!(
        r[&(1, 0)],
        TopicRecord {
            id: Some(id(B)),
            entry: None
        }
    );
    assert_eq!(r[&(1, 1)].entry, Some((2, -3)));
}

#[test]
fn the_id_rule_is_the_decoder_s() {
    assert_eq!(parse_id(&format!("id:{A}")), Some(id(A)));
    assert_eq!(parse_id(&format!("id:  {A}\t")), Some(id(A)));
    assert_eq!(parse_id(&format!("id:{A},id:{B}")), None, "two ids");
    assert_eq!(parse_id("id:not-a-uuid"), None);
    assert_eq!(parse_id("id:00000000-0000-0000-0000-000000000000"), None);
    assert_eq!(parse_id("id:ffffffff-ffff-ffff-ffff-ffffffffffff"), None);
    assert_eq!(parse_id("NO_HEADERS"), None);
    assert_eq!(parse_id("other:1"), None);
    assert_eq!(parse_id("id"), None, "a header without a value");
}

#[test]
fn the_entry_rule_wants_two_integers_in_i64() {
    assert_eq!(
        parse_entry(r#" {"account_id": 7, "amount": -2}"#),
        Some((7, -2))
    );
    assert_eq!(parse_entry(r#"{"account_id": 7}"#), None);
    assert_eq!(parse_entry(r#"{"account_id": "7", "amount": 1}"#), None);
    assert_eq!(parse_entry(r#"{"account_id": 7, "amount": 1.0}"#), None);
    assert_eq!(parse_entry(r#"{"account_id": true, "amount": 1}"#), None);
    assert_eq!(
        parse_entry(r#"{"account_id": 7, "amount": 9223372036854775808}"#),
        None
    );
    assert_eq!(parse_entry(r#"{"account_id":"#), None);
    assert_eq!(parse_entry(""), None);
    assert_eq!(parse_entry("[1, 2]"), None);
}

#[test]
fn spans_say_how_many_and_where_per_partition() {
    assert_eq!(
        spans([(1, 9), (0, 5), (0, 3), (1, 9), (0, 4)]),
        [
            "p0: 3 between offsets 3 and 5",
            "p1: 2 between offsets 9 and 9"
        ]
    );
    assert!(spans([]).is_empty());
}

/// Six records on two partitions: A credit 10, B debit 4 (account 1), a duplicate of A, a bad
/// record, C an overdraft of account 2.
fn topic() -> BTreeMap<Position, TopicRecord> {
    let rec = |i: &str, entry| TopicRecord {
        id: Some(id(i)),
        entry: Some(entry),
    };
    BTreeMap::from([
        ((0, 0), rec(A, (1, 10))),
        ((0, 1), rec(B, (1, -4))),
        ((0, 2), rec(A, (1, 10))),
        (
            (1, 0),
            TopicRecord {
                id: None,
                entry: Some((3, 1)),
            },
        ),
        ((1, 1), rec(C, (2, -1))),
    ])
}

/// The database the topic should leave.
fn exact() -> Database {
    Database {
        inbox: HashMap::from([(id(A), (0, 0)), (id(B), (0, 1)), (id(C), (1, 1))]),
        dead_letters: HashMap::from([
            ((1, 0), "missing_id".to_owned()),
            ((1, 1), "insufficient_funds".to_owned()),
        ]),
        balances: HashMap::from([(1, 6)]),
    }
}

#[test]
fn the_exact_database_has_nothing_lost_or_applied_twice() {
    let c = check(&topic(), &exact());
    assert_eq!(
        (c.topic_records, c.valid_ids, c.bad_records, c.inbox_rows),
        (5, 3, 1, 3)
    );
    assert_eq!((c.lost_valid_ids, c.lost_dead_letters), (0, 0));
    assert_eq!(c.rule_dead_letters_differing_from_inbox_replay, 0);
    assert!(!c.applied_twice);
}

#[test]
fn a_database_that_went_back_lost_rows_and_says_where() {
    let mut db = exact();
    db.inbox.remove(&id(B));
    db.dead_letters.remove(&(1, 0));
    db.balances.insert(1, 10);
    let c = check(&topic(), &db);
    assert_eq!(c.lost_valid_ids, 1);
    assert_eq!(c.lost_valid_where, ["p0: 1 between offsets 1 and 1"]);
    assert_eq!(c.lost_dead_letters_where, ["p1: 1 between offsets 0 and 0"]);
    assert!(!c.applied_twice, "a loss is not a second application");
}

#[test]
fn an_effect_applied_twice_shows_in_the_balances_and_rule_dead_letters() {
    let mut db = exact();
    db.balances.insert(1, 16);
    db.dead_letters.remove(&(1, 1));
    let c = check(&topic(), &db);
    assert!(c.applied_twice);
    assert_eq!(c.balances_differing_from_inbox_replay, 1);
    assert_eq!(
        c.balances_differing_examples,
        [Differing {
            account: 1,
            database: 16,
            inbox_replay: 6
        }]
    );
    assert_eq!(c.rule_dead_letters_differing_from_inbox_replay, 1);
}

#[test]
fn an_inbox_row_of_another_id_or_position_is_applied_twice() {
    let mut db = exact();
    db.inbox
        .insert(id("0190a8f0-0000-7000-8000-0000000000ff"), (0, 2));
    let c = check(&topic(), &db);
    assert_eq!((c.ids_not_in_topic, c.applied_twice), (1, true));
    let mut db = exact();
    db.inbox.insert(id(B), (0, 2));
    let c = check(&topic(), &db);
    assert_eq!(c.inbox_rows_at_wrong_position, 1);
    assert!(c.applied_twice);
}

#[test]
fn the_log_counts_warnings_rewound_records_errors_and_retries() {
    let log = "\
2026-12-02T05:20:01Z  WARN batch_inbox: the database's position is behind Kafka's committed offset topic=t partition=0 behind=120
2026-12-02T05:20:01Z  WARN batch_inbox: \x1b[3mgap\x1b[0m=30 the database went back: reading again from the database's position
2026-12-02T05:20:02Z  INFO batch_inbox: went back behind=99 (an INFO line)
2026-12-02T05:20:02Z  WARN batch_inbox: a transient error, will retry in 1s (backoff) offset_gap=5 gap=x
2026-12-02T05:20:03Z ERROR batch_inbox: connection refused
2026-12-02T05:20:03Z  WARN rdkafka: Retrying
";
    let c = LogCounts::of(log);
    assert_eq!(c.gap_warnings, 2);
    assert_eq!(c.records_rewound, 120 + 30 + 5);
    assert_eq!(c.error_lines, 1);
    assert_eq!(c.retry_lines, 2);
    assert_eq!(LogCounts::of(""), LogCounts::default());
}

#[test]
fn colors_are_stripped_and_fields_summed_left_to_right() {
    assert_eq!(strip_colors("\x1b[2mWARN\x1b[0m x"), "WARN x");
    assert_eq!(strip_colors("\x1b[x"), "\x1b[x");
    assert_eq!(rewound_in("behind=3 gap=4 behind= gap=x nogap=2 é"), 9);
    assert_eq!(rewound_in(""), 0);
}

#[test]
fn python_s_spelling_of_a_dict_a_boolean_and_none() {
    let m = BTreeMap::from([("b".to_owned(), 2), ("a".to_owned(), 1)]);
    assert_eq!(py_dict(&m), "{'a': 1, 'b': 2}");
    assert_eq!(py_dict(&BTreeMap::new()), "{}");
    assert_eq!((py_bool(true), py_bool(false)), ("True", "False"));
    assert_eq!(
        (py_opt(Some(3)), py_opt(None)),
        ("3".to_owned(), "None".to_owned())
    );
}

/// Every committed report of `results/failover/` (recursively), `(stem, JSON text, Markdown)`.
fn committed(prefix: &str) -> Vec<(PathBuf, String, String)> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<(PathBuf, String, String)>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                walk(&path, prefix, out);
            } else if name.starts_with(prefix) && name.ends_with(".json") {
                let md = path.with_extension("md");
                out.push((
                    path.clone(),
                    std::fs::read_to_string(&path).unwrap(),
                    std::fs::read_to_string(md).unwrap(),
                ));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/failover");
    let mut out = Vec::new();
    walk(&root, prefix, &mut out);
    assert!(!out.is_empty(), "no committed {prefix} report");
    out
}

fn common(v: &Value) -> Common {
    let s = |k: &str| v[k].as_str().unwrap().to_owned();
    let n = |k: &str| v[k].as_u64().unwrap();
    Common {
        run: s("run"),
        seed: n("seed"),
        messages: n("messages"),
        rate: n("rate"),
        binary: s("binary"),
        broker: s("broker"),
        postgres: s("postgres"),
        verdict: s("verdict"),
        verify: s("verify"),
    }
}

fn model(v: &Value) -> Model {
    serde_json::from_value::<crate::generate::Expected>(serde_json::json!({
        "records": v["model"]["records"], "new": v["model"]["new"],
        "duplicates": v["model"]["duplicates"], "dead_letters": v["model"]["dead_letters"],
        "balances": {},
    }))
    .map(|e| Model::from(&e))
    .unwrap()
}

fn check_of(v: &Value) -> Check {
    serde_json::from_value(v["check"].clone()).unwrap()
}

#[test]
fn committed_failover_reports_are_rebuilt_byte_for_byte_from_their_facts() {
    for (path, json, md) in committed("failover-") {
        let v: Value = serde_json::from_str(&json).unwrap();
        let i = |k: &str| v[k].as_i64();
        let readings = FailoverReadings {
            mode: v["mode"].as_str().unwrap().to_owned(),
            cut_lsn: v["replica_received_lsn_at_cut"].as_str().map(str::to_owned),
            primary_lsn_at_kill: v["primary_lsn_at_kill"].as_str().unwrap().to_owned(),
            primary_rows_before: i("primary_rows_last_read_before_kill").unwrap(),
            primary_positions_before: i("primary_positions_last_read_before_kill").unwrap(),
            primary_rows_at_kill: i("primary_rows_at_kill"),
            primary_positions_at_kill: i("primary_positions_at_kill"),
            replica_rows: i("replica_rows_at_promotion").unwrap(),
            replica_positions: i("replica_positions_at_promotion").unwrap(),
            final_rows: i("final_rows").unwrap(),
            final_positions: i("final_positions").unwrap(),
            drained: v["drained"].as_bool().unwrap(),
            drain_s: i("seconds_from_kill_to_drained").unwrap(),
            exits: serde_json::from_value(v["processor_exits"].clone()).unwrap(),
            restarts: v["processor_restarts"].as_u64().unwrap(),
        };
        let log = LogCounts {
            gap_warnings: v["processor_gap_warnings"].as_u64().unwrap(),
            records_rewound: v["processor_records_rewound"].as_u64().unwrap(),
            error_lines: v["processor_error_lines"].as_u64().unwrap(),
            retry_lines: v["processor_retry_lines"].as_u64().unwrap(),
        };
        let r = Failover::new(common(&v), readings, model(&v), log, check_of(&v));
        let rebuilt = String::from_utf8(serde_json::to_vec_pretty(&r).unwrap()).unwrap();
        assert_eq!(rebuilt, json, "{}", path.display());
        assert_eq!(r.markdown(), md, "{}", path.display());
    }
}

#[test]
fn committed_restore_reports_are_rebuilt_byte_for_byte_from_their_facts() {
    for (path, json, md) in committed("restore-") {
        let v: Value = serde_json::from_str(&json).unwrap();
        let i = |k: &str| v[k].as_i64().unwrap();
        let readings = RestoreReadings {
            backup: v["backup"].as_str().unwrap().to_owned(),
            recovery_target_time: v["recovery_target_time"].as_str().map(str::to_owned),
            backup_rows: i("rows_when_backed_up"),
            backup_positions: i("positions_when_backed_up"),
            rows_before_restore: i("rows_before_restore"),
            rows_after_restore: i("rows_after_restore"),
            positions_after_restore: i("positions_after_restore"),
            second_run_exit: i32::try_from(i("second_run_exit")).unwrap(),
            final_rows: i("final_rows"),
            final_positions: i("final_positions"),
        };
        let log = LogCounts {
            gap_warnings: v["processor_gap_warnings"].as_u64().unwrap(),
            records_rewound: v["processor_records_rewound"].as_u64().unwrap(),
            ..LogCounts::default()
        };
        let r = Restore::new(common(&v), readings, model(&v), log, check_of(&v));
        let rebuilt = String::from_utf8(serde_json::to_vec_pretty(&r).unwrap()).unwrap();
        assert_eq!(rebuilt, json, "{}", path.display());
        assert_eq!(r.markdown(), md, "{}", path.display());
    }
}

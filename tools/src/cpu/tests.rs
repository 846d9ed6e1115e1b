//! Tests of the `/proc` parsing, the tick conversion and the figures between two snapshots.

use super::sample::{figures, Figures, Reading, Snapshot};
use super::*;

/// A `/proc/PID/stat` line of a process whose name holds spaces and parentheses.
const TRICKY: &str = "4242 ((a b) c)) S 17 4242 4242 0 -1 4194560 900 0 0 0 \
                      250 75 30 12 20 0 3 0 1234 10000 200 18446744073709551615";

#[test]
fn a_name_with_spaces_and_parentheses_is_parsed_from_the_last_parenthesis() {
    let s = Stat::parse(TRICKY).expect("parses");
    assert_eq!(s.name, "(a b) c)");
    assert_eq!(s.ppid, 17);
    assert_eq!((s.utime, s.stime, s.cutime, s.cstime), (250, 75, 30, 12));
    assert_eq!(s.own_ticks(), 325);
}

#[test]
fn a_plain_stat_line_is_parsed() {
    let line = "1 (postgres) S 0 1 1 0 -1 4194560 10 0 0 0 7 3 100 50 20 0 1 0 5 1 1 1";
    let s = Stat::parse(line).expect("parses");
    assert_eq!((s.name.as_str(), s.ppid), ("postgres", 0));
    assert_eq!((s.utime, s.stime, s.cutime, s.cstime), (7, 3, 100, 50));
}

#[test]
fn a_cut_stat_line_is_none() {
    assert_eq!(Stat::parse("12 (x) S 1 2 3"), None);
    assert_eq!(Stat::parse("no parentheses at all"), None);
}

#[test]
fn this_process_reads_its_own_stat() {
    let s = Stat::read(std::process::id()).expect("own /proc entry");
    assert!(!s.name.is_empty());
    assert!(own_cpu_s() >= 0.0);
}

#[test]
fn ticks_become_seconds_at_the_given_clock_tick() {
    assert_eq!(ticks_to_s(250, 100), 2.5);
    assert_eq!(ticks_to_s(250, 250), 1.0);
    assert_eq!(ticks_to_s(1000, 1000), 1.0);
    assert!(clock_ticks_per_s() > 0);
    assert_eq!(seconds(clock_ticks_per_s()), 1.0);
}

#[test]
fn the_machine_line_counts_busy_time_without_idle_and_iowait() {
    let text = "cpu  100 5 20 1000 40 3 2 1 7 0\ncpu0 50 2 10 500 20 1 1 0 3 0\nintr 1\n";
    let m = MachineTicks::parse(text).expect("parses");
    // user nice system irq softirq steal; guest time is inside user already.
    assert_eq!(m.busy, 100 + 5 + 20 + 3 + 2 + 1);
    assert_eq!(m.total, m.busy + 1000 + 40);
    let later = MachineTicks {
        busy: m.busy + 30,
        total: m.total + 60,
    };
    assert_eq!(later.busy_share_since(&m), 0.5);
    assert_eq!(m.busy_share_since(&m), 0.0);
}

#[test]
fn names_are_compared_as_the_kernel_keeps_them() {
    assert_eq!(comm_of("nats-server"), "nats-server");
    assert_eq!(comm_of("a-very-long-process-name"), "a-very-long-pro");
    assert_eq!(comm_of("ééééééééé"), "ééééééé");
    let own = Stat::read(std::process::id()).expect("own /proc entry");
    assert!(pids_named(&own.name).contains(&std::process::id()));
}

#[test]
fn figures_are_differences_in_seconds_of_the_targets_read_at_both_ends() {
    let before = Snapshot {
        at_s: 100.0,
        hz: 100,
        process: Some(Reading { pid: 7, ticks: 50 }),
        postgres: Some(Reading {
            pid: 9,
            ticks: 1000,
        }),
        broker: Some(vec![
            Reading { pid: 11, ticks: 10 },
            Reading { pid: 12, ticks: 20 },
        ]),
        machine: Some(5000),
    };
    let after = Snapshot {
        at_s: 112.5,
        // The broker's second process ended: it is left out, not counted as a loss.
        broker: Some(vec![Reading {
            pid: 11,
            ticks: 410,
        }]),
        process: Some(Reading { pid: 7, ticks: 150 }),
        postgres: Some(Reading {
            pid: 9,
            ticks: 1650,
        }),
        machine: Some(7000),
        ..before.clone()
    };
    assert_eq!(
        figures(&before, &after, None),
        Figures {
            wall_s: 12.5,
            machine_cpu_s: Some(20.0),
            broker_cpu_s: Some(4.0),
            postgres_cpu_s: Some(6.5),
            process_cpu_s: Some(1.0),
        }
    );
    // A command's own CPU (`cpu run`) replaces the process reading.
    assert_eq!(
        figures(&before, &after, Some(3.25)).process_cpu_s,
        Some(3.25)
    );
}

#[test]
fn a_target_missing_at_an_end_has_no_figure_and_counters_never_go_below_zero() {
    let before = Snapshot {
        at_s: 1.0,
        hz: 100,
        postgres: Some(Reading { pid: 9, ticks: 500 }),
        machine: Some(900),
        ..Snapshot::default()
    };
    let after = Snapshot {
        at_s: 2.0,
        hz: 100,
        postgres: None,
        machine: Some(800),
        ..Snapshot::default()
    };
    let f = figures(&before, &after, None);
    assert_eq!(f.postgres_cpu_s, None);
    assert_eq!(f.machine_cpu_s, Some(0.0));
    assert_eq!(f.broker_cpu_s, None);
    // Only the figures asked for and read are written, in the load test's order.
    assert_eq!(
        serde_json::to_string(&f).unwrap(),
        r#"{"wall_s":1.0,"machine_cpu_s":0.0}"#
    );
}

#[test]
fn the_load_test_sample_reads_back_with_its_fields() {
    let f: Figures = serde_json::from_str(
        r#"{"wall_s": 10.0, "machine_cpu_s": 18.0, "broker_cpu_s": 5.0, "postgres_cpu_s": 6.5}"#,
    )
    .unwrap();
    assert_eq!(f.broker_cpu_s, Some(5.0));
    assert_eq!(f.process_cpu_s, None);
}

//! What an operator copies reads only what the processor serves: every metric name in
//! `deploy/prometheus/alerts.yml` and `deploy/grafana/batch-inbox.json` is a series of a running
//! binary's `/metrics`, and the stalled gauge of a partition that waits on the database carries
//! `reason="database"`, which the database's alert selects and the breaker's does not. The
//! rules docs/OPERATIONS.md shows are an excerpt of the file, not a second copy.
//!
//! Every name is checked against a sample line, none against its HELP/TYPE lines alone: the run
//! brings out each series that shows only after an event. A table renamed away before the run
//! stalls both partitions (`batch_inbox_stalled`, `batch_inbox_stall_retries_total`); once it is
//! back, the records commit (the histograms get samples) with a duplicate and a record without
//! an id among them (`batch_inbox_dead_letters_total` shows the pipeline's reasons from the
//! start anyway), and librdkafka's statistics every 200 ms give `batch_inbox_consumer_lag_messages`.
//! The rewind counters have no label, so they are served at 0 from the start. Prometheus's own
//! series (`up`) are not the processor's and are not checked; the rules define no recording rule.

use crate::common;
use crate::common::child::Running;
use crate::common::http;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use common::{fresh_db, uuid, Kafka};

const TOPIC: &str = "deploy-metrics";

/// The metric names (`batch_inbox_…`) that `text` mentions: each maximal run of name characters
/// that starts with the prefix.
fn metric_names(text: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("batch_inbox_") {
        let starts_a_name = !rest[..at].ends_with(is_name);
        let tail = &rest[at..];
        let end = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        if starts_a_name {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The names of the sample lines of an OpenMetrics text (histograms: `_bucket`, `_sum`, `_count`).
fn sample_names(samples: &BTreeMap<String, f64>) -> BTreeSet<String> {
    samples
        .keys()
        .map(|series| series.split('{').next().unwrap_or(series).to_owned())
        .collect()
}

async fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let (status, body) = http::get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    http::samples(&body)
}

fn deploy_file(path: &str) -> String {
    let path = format!("{}/deploy/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn metric_names_are_read_as_promql_writes_them() {
    let expr = r#"histogram_quantile(0.99, sum by (le) (rate(batch_inbox_stage_duration_seconds_bucket{stage="commit"}[5m]))) / x_batch_inbox_not_ours + batch_inbox:recorded"#;
    assert_eq!(
        metric_names(expr),
        BTreeSet::from(["batch_inbox_stage_duration_seconds_bucket".to_owned()])
    );
}

/// docs/OPERATIONS.md shows an excerpt of the rules, not a copy of its own: each YAML block of
/// its "Alerts to set" section is a verbatim part of alerts.yml.
#[test]
fn the_rules_shown_in_operations_are_those_of_the_rules_file() {
    let docs =
        std::fs::read_to_string(format!("{}/docs/OPERATIONS.md", env!("CARGO_MANIFEST_DIR")))
            .expect("docs/OPERATIONS.md");
    let section = docs
        .split("### Alerts to set")
        .nth(1)
        .and_then(|s| s.split("\n### ").next())
        .expect("an \"Alerts to set\" section");
    let rules = deploy_file("prometheus/alerts.yml");
    let blocks: Vec<&str> = section
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().expect("a closed block"))
        .collect();
    assert_eq!(blocks.len(), 1, "{section}");
    for block in blocks {
        assert!(rules.contains(block), "not in alerts.yml:\n{block}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_alerts_and_the_dashboard_read_is_served() {
    let (url, pool) = fresh_db("deploy_metrics").await;
    let db = pool.get().await.unwrap();
    db.batch_execute("ALTER TABLE balances RENAME TO balances_away")
        .await
        .unwrap();
    let kafka = Kafka::new(TOPIC, 2);
    // 10 new entries, a copy of the first, an overdraft and a record without an id: 13 records.
    for i in 0..10u32 {
        kafka.send_entry((i % 2) as i32, &uuid(i), 1, 10).await;
    }
    kafka.send_entry(0, &uuid(0), 1, 10).await;
    kafka.send_entry(1, &uuid(10), 2, -5).await;
    let value = br#"{"account_id":1,"amount":1}"#.as_slice();
    kafka.send(0, Some("1"), Some(value), &[]).await;

    let mut run = Running::spawn(
        &[
            "run",
            "--database-url",
            &url,
            "--brokers",
            &kafka.brokers,
            "--topic",
            TOPIC,
            "--group",
            TOPIC,
            "--metrics-addr",
            "127.0.0.1:0",
            "--log-interval",
            "0",
            "-X",
            "statistics.interval.ms=200",
            "-X",
            "session.timeout.ms=6000",
        ],
        &[("RUST_LOG", "info,rdkafka=warn")],
    );
    let addr = run.metrics_addr().await;

    // Stalled on the missing table: each partition's series says `database`, and no other.
    let stalled = http::poll(
        Duration::from_secs(60),
        "both partitions stalled on 42P01",
        || async {
            let m = scrape(addr).await;
            let stalled: BTreeMap<String, f64> = m
                .iter()
                .filter(|(series, _)| series.starts_with("batch_inbox_stalled{"))
                .map(|(series, value)| (series.clone(), *value))
                .collect();
            let retried = m
                .get("batch_inbox_stall_retries_total{sqlstate=\"42P01\"}")
                .is_some_and(|n| *n >= 2.0);
            (stalled.len() == 2 && retried).then_some((stalled, m))
        },
    )
    .await;
    let (stalled, during) = stalled;
    assert_eq!(
        stalled,
        BTreeMap::from([
            (
                format!(
                    "batch_inbox_stalled{{topic=\"{TOPIC}\",partition=\"0\",reason=\"database\"}}"
                ),
                1.0
            ),
            (
                format!(
                    "batch_inbox_stalled{{topic=\"{TOPIC}\",partition=\"1\",reason=\"database\"}}"
                ),
                1.0
            ),
        ])
    );

    db.batch_execute("ALTER TABLE balances_away RENAME TO balances")
        .await
        .unwrap();
    let after = http::poll(
        Duration::from_secs(60),
        "13 records committed and no lag",
        || async {
            let m = scrape(addr).await;
            let lags: Vec<f64> = (0..2)
                .filter_map(|p| {
                    let series = format!(
                        "batch_inbox_consumer_lag_messages{{topic=\"{TOPIC}\",partition=\"{p}\"}}"
                    );
                    m.get(&series).copied()
                })
                .collect();
            let done =
                m.get("batch_inbox_messages_consumed_total") == Some(&13.0) && lags == [0.0, 0.0];
            done.then_some(m)
        },
    )
    .await;
    for (series, value) in [
        ("batch_inbox_messages_new_total", 11.0),
        ("batch_inbox_duplicates_skipped_total", 1.0),
        ("batch_inbox_dead_letters_total{reason=\"missing_id\"}", 1.0),
        (
            "batch_inbox_dead_letters_total{reason=\"insufficient_funds\"}",
            1.0,
        ),
        ("batch_inbox_positions_rewound_total", 0.0),
        (
            &format!(
                "batch_inbox_stalled{{topic=\"{TOPIC}\",partition=\"0\",reason=\"database\"}}"
            ),
            0.0,
        ),
    ] {
        assert_eq!(after.get(series), Some(&value), "{series}: {after:#?}");
    }
    let finished = run.stop().await;
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);

    let served: BTreeSet<String> = sample_names(&during)
        .into_iter()
        .chain(sample_names(&after))
        .collect();
    for file in ["prometheus/alerts.yml", "grafana/batch-inbox.json"] {
        let used = metric_names(&deploy_file(file));
        assert!(used.len() >= 10, "{file} reads {used:?}");
        let missing: Vec<&String> = used.difference(&served).collect();
        assert_eq!(
            missing,
            Vec::<&String>::new(),
            "{file} reads metrics the processor does not serve; it serves {served:#?}"
        );
    }
}

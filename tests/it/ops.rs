//! The operations listener during a run: /metrics serves every named series, and its counters
//! equal the rows in the database afterwards; /healthz and /readyz answer.

use crate::common;
use crate::common::http;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use batch_inbox::ledger::Ledger;
use batch_inbox::Mode;
use batch_inbox::Stats;
use common::{config, fresh_db, uuid, Kafka};
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 4;

/// 40 new entries, 5 redelivered copies, 3 bad records, 2 overdrafts: 50 records.
async fn send_input(kafka: &Kafka) {
    for i in 0..40u32 {
        let p = (i % PARTITIONS as u32) as i32;
        kafka.send_entry(p, &uuid(i), i64::from(i % 7), 10).await;
    }
    for i in 0..5u32 {
        let p = (i % PARTITIONS as u32) as i32;
        kafka.send_entry(p, &uuid(i), i64::from(i % 7), 10).await;
    }
    let value = br#"{"account_id":1,"amount":1}"#.as_slice();
    kafka.send(0, Some("1"), Some(value), &[]).await;
    kafka
        .send(1, Some("1"), Some(value), &[("id", Some(b"not-a-uuid"))])
        .await;
    let id = uuid(100);
    kafka
        .send(2, Some("1"), None, &[("id", Some(id.as_bytes()))])
        .await;
    kafka.send_entry(3, &uuid(101), 1001, -5).await;
    kafka.send_entry(3, &uuid(102), 1002, -5).await;
}

fn value(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("{series} not served; got {samples:#?}"))
}

async fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let (status, body) = http::get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    http::samples(&body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_are_served_during_a_run_and_agree_with_the_database() {
    let (url, pool) = fresh_db("metrics").await;
    let kafka = Kafka::new("ops-metrics", PARTITIONS);
    send_input(&kafka).await;

    let stats = Arc::new(Stats::default());
    let stop = CancellationToken::new();
    let addr = common::listener(&url, &pool, &stats, &stop).await;
    let mut settings = kafka.settings("ops-metrics");
    settings
        .overrides
        .push(("statistics.interval.ms".into(), "200".into()));
    let mut cfg = config(settings, Mode::Batched, 10);
    cfg.exit_on_eof = false;
    let run = tokio::spawn(batch_inbox::run_with_stats(
        cfg,
        pool.clone(),
        Arc::new(Ledger),
        stats.clone(),
        stop.clone().cancelled_owned(),
    ));

    // While the processor runs: every record committed and every partition's lag at zero.
    let m = http::poll(
        Duration::from_secs(60),
        "50 records and zero lag",
        || async {
            let m = scrape(addr).await;
            let lags: Vec<f64> = (0..PARTITIONS)
                .filter_map(|p| {
                    let series = format!(
                    "batch_inbox_consumer_lag_messages{{topic=\"ops-metrics\",partition=\"{p}\"}}"
                );
                    m.get(&series).copied()
                })
                .collect();
            let done = m.get("batch_inbox_messages_consumed_total") == Some(&50.0)
                && lags.len() == PARTITIONS as usize
                && lags.iter().all(|l| *l == 0.0);
            done.then_some(m)
        },
    )
    .await;
    assert_eq!(http::get(addr, "/healthz").await, (200, "ok\n".to_owned()));
    let (status, body) = http::get(addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "ready: database reachable, 4 partition(s) assigned\n");

    assert_eq!(value(&m, "batch_inbox_messages_new_total"), 42.0);
    assert_eq!(value(&m, "batch_inbox_duplicates_skipped_total"), 5.0);
    assert_eq!(value(&m, "batch_inbox_retries_total"), 0.0);
    assert_eq!(value(&m, "batch_inbox_assigned_partitions"), 4.0);
    assert_eq!(value(&m, "batch_inbox_batches_in_flight"), 0.0);
    assert_eq!(value(&m, "batch_inbox_unsafe_mode"), 0.0);
    assert_eq!(value(&m, "batch_inbox_pool_connections_max"), 8.0);
    assert!(value(&m, "batch_inbox_pool_connections_in_use") <= 8.0);
    let batches = value(&m, "batch_inbox_batches_committed_total");
    assert!(batches >= 5.0, "at most 10 records per batch: {batches}");
    assert_eq!(value(&m, "batch_inbox_batch_messages_count"), batches);
    assert_eq!(value(&m, "batch_inbox_batch_messages_sum"), 50.0);
    assert_eq!(
        value(&m, "batch_inbox_end_to_end_latency_seconds_count"),
        50.0
    );
    assert_eq!(
        value(
            &m,
            "batch_inbox_end_to_end_latency_seconds_bucket{le=\"+Inf\"}"
        ),
        50.0
    );
    for stage in [
        "batch_wait",
        "dedup",
        "handler",
        "dead_letters",
        "commit",
        "offset_store",
    ] {
        let series = format!("batch_inbox_stage_duration_seconds_count{{stage=\"{stage}\"}}");
        assert_eq!(value(&m, &series), batches, "{stage}");
    }

    // The counters equal the rows the run wrote.
    let c = pool.get().await.unwrap();
    let inbox: i64 = c
        .query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(inbox as f64, value(&m, "batch_inbox_messages_new_total"));
    let by_reason: BTreeMap<String, i64> = c
        .query("SELECT reason, count(*) FROM dead_letters GROUP BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expected: BTreeMap<String, i64> = [
        ("empty_payload", 1),
        ("insufficient_funds", 2),
        ("invalid_id", 1),
        ("missing_id", 1),
    ]
    .into_iter()
    .map(|(r, n)| (r.to_owned(), n))
    .collect();
    assert_eq!(by_reason, expected);
    // Every reason has its series: the pipeline's and the ledger's own (declared, so at 0 too).
    let ledger = <batch_inbox::ledger::Ledger as batch_inbox::Handler>::REJECTIONS;
    for reason in batch_inbox::Reason::PIPELINE.iter().chain(ledger) {
        let series = format!("batch_inbox_dead_letters_total{{reason=\"{reason}\"}}");
        let rows = by_reason.get(reason.as_str()).copied().unwrap_or(0);
        assert_eq!(value(&m, &series), rows as f64, "{reason}");
    }

    stop.cancel();
    run.await.unwrap().unwrap();
    http::poll(Duration::from_secs(10), "the listener to close", || async {
        tokio::net::TcpStream::connect(addr)
            .await
            .is_err()
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_json_lines_whose_summaries_add_up_to_the_run() {
    let (url, _pool) = fresh_db("binary_logs").await;
    let kafka = Kafka::new("ops-binary", PARTITIONS);
    send_input(&kafka).await;
    let brokers = kafka.brokers.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_batch-inbox"))
            .args(["--log-format", "json", "run", "--database-url", &url])
            .args(["--brokers", &brokers, "--topic", "ops-binary"])
            .args([
                "--group",
                "ops-binary",
                "--batch-size",
                "10",
                "--exit-on-eof",
            ])
            .args(["--log-interval", "100ms", "--metrics-addr", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .env_remove("BATCH_INBOX_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let (summaries, others): (Vec<_>, Vec<_>) = lines
        .iter()
        .partition(|l| l["target"] == "batch_inbox::summary");
    let total = |field: &str| -> u64 { summaries.iter().map(|l| l[field].as_u64().unwrap()).sum() };
    assert_eq!(
        [
            total("records"),
            total("new"),
            total("duplicates"),
            total("dead_letters")
        ],
        [50, 42, 5, 5],
        "{stderr}"
    );
    assert!(summaries
        .iter()
        .all(|l| l["level"] == "INFO" && l["lag"].is_i64() && l.get("unsafe_mode").is_none()));
    assert!(
        others.iter().any(|l| l["message"].as_str().is_some_and(
            |m| m.starts_with("serving /metrics, /healthz and /readyz on http://127.0.0.1:")
        )),
        "{stderr}"
    );
    assert!(others.len() < 20, "no line per message: {stderr}");
}

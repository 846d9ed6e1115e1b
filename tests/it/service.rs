//! The library's service (`batch_inbox::Service`), as a team embedding the library runs it: the
//! same start-up checks, retention, stats file and run as the binary's `run`, with a handler of
//! its own. Checked on the database's rows and the stats file's counts.

use crate::common::*;
use std::sync::Arc;
use std::time::Duration;

use batch_inbox::ledger::Ledger;
use batch_inbox::stats_file::StatsReport;
use batch_inbox::DatabaseUrl;
use batch_inbox::{db, Mode, Service, ServiceConfig, ServiceError, Stats};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_service_runs_with_the_binarys_wiring() {
    let (url, pool) = fresh_db("service_embedded").await;
    let kafka = Kafka::new("service-embedded", 2);
    for i in 0..20 {
        kafka
            .send_entry((i % 2) as i32, &uuid(i), 1 + (i % 2) as i64, 5)
            .await;
    }
    kafka.send_entry(0, &uuid(3), 2, 5).await; // a copy of an id already sent
    let stats_path = std::env::temp_dir().join(format!("service-{}.json", std::process::id()));
    let mut config = ServiceConfig::new(
        config(kafka.settings("g"), Mode::Batched, 4),
        DatabaseUrl::new(url.clone()),
    );
    config.uses.push(db::Uses::Ledger);
    config.stats_file = Some(stats_path.clone());
    config.log_interval = Duration::ZERO;
    let service = Service::start(
        config,
        |pool| async move { batch_inbox::ledger::check_schema(&pool).await },
        |_| async { Ok::<_, ServiceError>(()) },
    )
    .await
    .expect("the database answers the start-up checks");
    let stats = Arc::new(Stats::with_report());
    tokio::time::timeout(
        Duration::from_secs(60),
        service.run(Arc::new(Ledger), stats.clone(), std::future::pending()),
    )
    .await
    .expect("drained within 60 s")
    .expect("the service succeeded");

    let s = stats.snapshot();
    assert_eq!((s.records, s.new, s.duplicates), (21, 20, 1));
    let t = tables(&pool).await;
    assert_eq!(t.balances, vec![(1, 50), (2, 50)]);
    assert_eq!(t.inbox.len(), 20);
    let report: StatsReport = serde_json::from_slice(&std::fs::read(&stats_path).unwrap()).unwrap();
    assert_eq!((report.stats.records, report.stats.new), (21, 20));
    let _ = std::fs::remove_file(&stats_path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_behind_stops_the_service_before_anything_is_consumed() {
    let (url, _pool) = empty_db("service_no_schema").await;
    let kafka = Kafka::new("service-no-schema", 1);
    let config = ServiceConfig::new(
        config(kafka.settings("g"), Mode::Batched, 4),
        DatabaseUrl::new(url),
    );
    let started = Service::start(
        config,
        |pool| async move { db::check_schema(&pool).await },
        |_| async { Ok::<_, ServiceError>(()) },
    )
    .await;
    let Err(e) = started else {
        panic!("a database without the core's tables must not start")
    };
    let line = batch_inbox::one_line_error(&e);
    assert!(line.contains("migrate"), "{line}");
}

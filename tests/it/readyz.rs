//! /readyz follows the database: not ready while PostgreSQL is stopped, ready again once it is
//! started, while /healthz stays up. Uses a private PostgreSQL server, never the shared one.

use crate::common;
use crate::common::http;
use crate::common::postgres;
use std::sync::Arc;
use std::time::Duration;

use batch_inbox::ledger::Ledger;
use batch_inbox::Stats;
use batch_inbox::{db, Mode};
use common::{config, db_name, Kafka};
use tokio_util::sync::CancellationToken;

/// Polls /readyz until it answers `status`; returns the body.
async fn readyz_becomes(addr: std::net::SocketAddr, status: u16) -> String {
    let what = format!("/readyz to answer {status}");
    http::poll(Duration::from_secs(60), &what, || async {
        let (s, body) = http::get(addr, "/readyz").await;
        (s == status).then_some(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_flips_when_postgres_stops_and_starts() {
    let pg = postgres::PrivatePostgres::start();
    let name = db_name("readyz");
    let admin = db::connect(&pg.url("postgres"), 1).await.unwrap();
    let c = admin.get().await.unwrap();
    c.batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    drop(c);
    let url = pg.url(&name);
    let pool = db::connect(&url, 4).await.unwrap();
    db::migrate(&pool).await.unwrap();
    batch_inbox::ledger::migrate(&pool).await.unwrap();

    let stats = Arc::new(Stats::default());
    let stop = CancellationToken::new();
    let addr = common::listener(&url, &pool, &stats, &stop).await;
    // Before the processor joins the group: the database answers, but no partition is assigned.
    assert_eq!(
        http::get(addr, "/readyz").await,
        (503, "not ready: no partition\n".to_owned())
    );

    let kafka = Kafka::new("ops-readyz", 2);
    let mut cfg = config(kafka.settings("ops-readyz"), Mode::Batched, 10);
    cfg.exit_on_eof = false;
    let run = tokio::spawn(batch_inbox::run_with_stats(
        cfg,
        pool.clone(),
        Arc::new(Ledger),
        stats.clone(),
        stop.clone().cancelled_owned(),
    ));
    let body = readyz_becomes(addr, 200).await;
    assert_eq!(body, "ready: database reachable, 2 partition(s) assigned\n");

    pg.stop_immediate();
    let body = readyz_becomes(addr, 503).await;
    assert_eq!(body, "not ready: database\n");
    assert_eq!(http::get(addr, "/healthz").await, (200, "ok\n".to_owned()));

    pg.start_server();
    let body = readyz_becomes(addr, 200).await;
    assert_eq!(body, "ready: database reachable, 2 partition(s) assigned\n");

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("processor stops")
        .unwrap()
        .unwrap();
}

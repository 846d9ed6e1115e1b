//! `dead-letters list`: the table and `--json` lines of a few dead letters, parked and
//! re-driven, and a dead letter with an id that is not a UUID, selected by `--reason` and
//! `--id`, decoded again and kept.

use std::time::Duration;

use super::{counts, entry, exec, pipeline, redrive_bin, report, NO_SEVEN};
use crate::common::child::Running;
use crate::common::raw_producer::RawRecord;
use crate::common::scenario::Scenario;
use crate::common::uuid;

/// `batch-inbox dead-letters list --database-url URL extra…`: its stdout.
async fn list(url: &str, extra: &[&str]) -> String {
    let mut args = vec!["dead-letters", "list", "--database-url", url];
    args.extend(extra);
    let out = Running::spawn(&args, &[])
        .wait(Duration::from_secs(30))
        .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_position_id_reason_detail_and_redrive_state() {
    let not_a_uuid = RawRecord {
        headers: vec![(b"id".to_vec(), Some(b"order-17".to_vec()))],
        ..entry("", 5, 1)
    };
    let world = Scenario::new("redrive_list")
        .records([entry(&uuid(1), 7, 3), not_a_uuid, entry(&uuid(2), 5, 4)])
        .build()
        .await;
    let ((url, pool), topic) = (world.db(), world.topic.clone());
    exec(&pool, NO_SEVEN).await;
    pipeline(&world, "g", None).await;
    exec(&pool, "ALTER TABLE balances DROP CONSTRAINT no_seven").await;
    assert_eq!(report(&redrive_bin(&url, &[], &[]).await), counts(1, 0, 0));
    // Selected by its reason and its id as stored: decoded again, fails again, stays.
    let run = redrive_bin(&url, &["--reason", "invalid_id", "--id", "order-17"], &[]).await;
    assert_eq!(report(&run).failed_decoding, 1);

    let table = list(&url, &[]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let head: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        head,
        [
            "POSITION",
            "ID",
            "REASON",
            "REDRIVE",
            "CREATED_AT",
            "DETAIL"
        ]
    );
    let first: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        first[..4],
        [
            &format!("{topic}/0/0")[..],
            &uuid(1),
            "handler_error",
            "applied"
        ]
    );
    let second: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        second[..6],
        [
            &format!("{topic}/0/1")[..],
            "order-17",
            "invalid_id",
            "parked",
            "(1",
            "failed"
        ]
    );
    assert!(
        lines[2].contains("failed decoding again: invalid_id: id \"order-17\" is not a UUID"),
        "{table}"
    );

    let json = list(&url, &["--json", "--reason", "invalid_id", "--since", "1h"]).await;
    let objects: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objects.len(), 1, "{json}");
    let mut o = objects[0].clone();
    let created = o["created_at"].take();
    assert!(
        created
            .as_str()
            .is_some_and(|t| t.len() == 24 && t.ends_with('Z')),
        "{created}"
    );
    let detail = o["detail"].take();
    assert!(detail
        .as_str()
        .unwrap()
        .starts_with("failed decoding again: invalid_id"));
    assert_eq!(
        o,
        serde_json::json!({
            "topic": topic, "partition": 0, "offset": 1, "message_id": "order-17",
            "reason": "invalid_id", "detail": null, "created_at": null, "redriven_at": null,
            "redrive_outcome": null, "redrive_attempts": 1,
        })
    );
    assert!(
        !json.contains("postgres://"),
        "no connection string: {json}"
    );
}

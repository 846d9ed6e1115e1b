//! Settings that would silently break the guarantee are refused with a one-line reason before
//! anything is touched; the unsafe test-only switches show in `/metrics` and on every summary
//! line of the run.

use std::process::Command;

/// Runs `run` against a database that cannot be reached, with `args` and a config file holding
/// `file` (TOML); returns the exit code and stderr.
fn run(args: &[&str], file: &str) -> (i32, String) {
    let path = std::env::temp_dir().join(format!(
        "unsafe-settings-{}-{}.toml",
        std::process::id(),
        args.len()
    ));
    std::fs::write(&path, file).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_batch-inbox"))
        .args([
            "run",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/none",
            "--startup-timeout",
            "0",
        ])
        .args([
            "--brokers",
            "127.0.0.1:1",
            "--config",
            path.to_str().unwrap(),
        ])
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("BATCH_INBOX_CONFIG")
        .env_remove("BATCH_INBOX_OFFSETS_IN_DB")
        .env_remove("BATCH_INBOX_EXIT_ON_EOF")
        .env_remove("BATCH_INBOX_GROUP")
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn the_binary_refuses_unsafe_properties_before_touching_the_database() {
    for (args, file, key) in [
        (
            vec!["-X", "enable.auto.offset.store=true"],
            "",
            "enable.auto.offset.store",
        ),
        (vec!["-X", "group.id=other"], "", "group.id"),
        (
            vec!["-X", "isolation.level=read_uncommitted"],
            "",
            "isolation.level",
        ),
        (
            vec!["-X", "auto.offset.reset=latest"],
            "",
            "auto.offset.reset",
        ),
        (
            vec!["-X", "enable.partition.eof=true"],
            "",
            "enable.partition.eof",
        ),
        (
            vec!["--offsets-in-db=false", "-X", "enable.auto.commit=false"],
            "",
            "enable.auto.commit",
        ),
        (
            vec![],
            "[librdkafka]\n\"enable.auto.offset.store\" = true\n",
            "enable.auto.offset.store",
        ),
    ] {
        let (code, err) = run(&args, file);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        let prefix = format!("error: refused -X {key} (safe: ");
        assert!(err.starts_with(&prefix), "{args:?}: {err}");
    }
    // Safe: past the check, the run stops at the unreachable database.
    for args in [
        vec!["-X", "enable.auto.commit=false"],
        vec![
            "-X",
            "group.id=batch-inbox",
            "-X",
            "auto.offset.reset=smallest",
        ],
        vec!["--exit-on-eof", "-X", "enable.partition.eof=true"],
    ] {
        let (code, err) = run(&args, "");
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: cannot connect to the database"),
            "{args:?}: {err}"
        );
    }
}

/// The unsafe switches exist only in `unsafe-controls` builds.
#[cfg(feature = "unsafe-controls")]
mod unsafe_mode {
    use std::time::Duration;

    use crate::common::{self, child, http};
    use common::{fresh_db, uuid, Kafka};

    /// The run applies redeliveries twice under `--unsafe-no-inbox`; while it runs, /metrics says
    /// so, and so does every summary line.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unsafe_switches_show_in_metrics_and_on_every_summary_line() {
        let (url, pool) = fresh_db("unsafe_mode").await;
        let kafka = Kafka::new("unsafe-mode", 2);
        let mut run = child::Running::spawn(
            &[
                "--log-format",
                "json",
                "run",
                "--database-url",
                &url,
                "--brokers",
                &kafka.brokers,
                "--topic",
                "unsafe-mode",
                "--group",
                "unsafe-mode",
                "--unsafe-no-inbox",
                "--metrics-addr",
                "127.0.0.1:0",
                "--log-interval",
                "100ms",
            ],
            &[("RUST_LOG", "info")],
        );
        let addr = run.metrics_addr().await;
        let (status, body) = http::get(addr, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            http::samples(&body).get("batch_inbox_unsafe_mode"),
            Some(&1.0),
            "{body}"
        );
        // Three ids, each sent twice: without the inbox, each copy is applied.
        for i in 0..6u32 {
            kafka.send_entry((i % 2) as i32, &uuid(i % 3), 1, 10).await;
        }
        let c = pool.get().await.unwrap();
        let applied = "SELECT coalesce(sum(amount), 0)::bigint FROM balances";
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while c.query_one(applied, &[]).await.unwrap().get::<_, i64>(0) < 60 {
            assert!(
                std::time::Instant::now() < deadline,
                "six copies applied in 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let out = run.stop().await;
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        let (inbox, total): (i64, i64) = {
            let row = c
                .query_one(
                    "SELECT (SELECT count(*) FROM inbox), (SELECT sum(amount)::bigint FROM balances)",
                    &[],
                )
                .await
                .unwrap();
            (row.get(0), row.get(1))
        };
        assert_eq!((inbox, total), (0, 60), "six copies applied, no inbox row");

        let lines: Vec<serde_json::Value> = out
            .stderr
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        let summaries: Vec<_> = lines
            .iter()
            .filter(|l| l["target"] == "batch_inbox::summary")
            .collect();
        assert!(!summaries.is_empty(), "{}", out.stderr);
        for s in &summaries {
            assert_eq!(s["level"], "WARN", "{s}");
            assert_eq!(s["unsafe_mode"], "--unsafe-no-inbox", "{s}");
            assert!(
                s["message"].as_str().is_some_and(|m| m.contains("UNSAFE")),
                "{s}"
            );
        }
        let records: u64 = summaries
            .iter()
            .map(|s| s["records"].as_u64().unwrap())
            .sum();
        assert_eq!(records, 6, "{}", out.stderr);
        assert!(
            lines.iter().any(|l| l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("UNSAFE: --unsafe-no-inbox is set"))),
            "{}",
            out.stderr
        );
    }
}

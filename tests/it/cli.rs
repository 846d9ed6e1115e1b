//! Bad command lines and unreachable services end with a non-zero exit and a one-line reason,
//! before anything is consumed.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_batch-inbox"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BROKERS")
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn zero_batch_size_is_refused() {
    let (code, err) = run(&["run", "--batch-size", "0"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: invalid value '0' for '--batch-size"),
        "{err}"
    );
}

/// Daily partitions prepared ahead are bounded (a year): an absurd count would create that many
/// partitions, and days past the year 9999 have no partition name.
#[test]
fn partitions_ahead_beyond_a_year_are_refused() {
    for command in [
        &["migrate", "--partitioned"][..],
        &["run"][..],
        &["cleanup", "--retention", "7d"][..],
    ] {
        let mut args = command.to_vec();
        args.extend(["--partitions-ahead", "3000000"]);
        let (code, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("invalid value '3000000' for '--partitions-ahead") && err.contains("366"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn unknown_mode_is_refused() {
    let (code, err) = run(&["run", "--mode", "eventually"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("invalid value 'eventually' for '--mode"),
        "{err}"
    );
}

#[test]
fn unreachable_database_fails_before_consuming() {
    let (code, err) = run(&[
        "run",
        "--database-url",
        "postgres://postgres@127.0.0.1:1/none",
        "--brokers",
        "127.0.0.1:1",
        "--exit-on-eof",
        "--startup-timeout",
        "0",
    ]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: cannot connect to the database"),
        "{err}"
    );
}

#[test]
fn help_explains_every_flag_with_its_default() {
    let out = Command::new(env!("CARGO_BIN_EXE_batch-inbox"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--database-url",
        "--brokers",
        "--topic",
        "--group",
        "--mode",
        "--batch-size",
        "--batch-linger-ms",
        "--batch-max-bytes",
        "--pool-size",
        "--id-header",
        "-X",
        "--exit-on-eof",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    assert!(help.contains("[default: 1000]") && help.contains("[env: DATABASE_URL]"));
}

//! The binary combines a config file, environment variables and flags (flags over the
//! environment, the environment over the file, the file over the defaults), and refuses a bad
//! file in one line. How each setting combines is tested where the file is read (the binary's
//! `cli::config_file` unit tests).

use std::path::PathBuf;
use std::process::Command;

/// Settings for each source to show: the file's batch size and topic, a linger and a pool size
/// that the environment and a flag override, a secret.
const FILE: &str = r#"
batch-size = 500
batch-linger-ms = 7
pool-size = 3
topic = "from-file"

[librdkafka]
"sasl.password" = "hunter2"
"#;

fn write(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ops-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn binary(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_batch-inbox"));
    cmd.args(args);
    for var in [
        "BATCH_INBOX_BATCH_LINGER_MS",
        "BATCH_INBOX_POOL_SIZE",
        "BATCH_INBOX_CONFIG",
        "BATCH_INBOX_BATCH_SIZE",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binary_combines_file_env_and_flags() {
    let path = write("binary", FILE);
    let (code, out, err) = binary(
        &["run", "--pool-size", "5", "--print-config"],
        &[
            ("BATCH_INBOX_CONFIG", path.to_str().unwrap()),
            ("BATCH_INBOX_BATCH_LINGER_MS", "9"),
            ("BATCH_INBOX_POOL_SIZE", "4"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    for line in [
        "batch-size = \"500\"  # file",
        "batch-linger-ms = \"9\"  # env",
        "pool-size = \"5\"  # flag",
        "topic = \"from-file\"  # file",
        "group = \"batch-inbox\"  # default",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "{line} missing from:\n{out}"
        );
    }
    assert!(
        out.contains("sasl.password=***") && !out.contains("hunter2"),
        "secrets are not printed: {out}"
    );

    let bad = write("binary-bad", "batch-sise = 3\n");
    let (code, _, err) = binary(&["run", "--config", bad.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: config file ") && err.contains("unknown key `batch-sise`"));
}

//! The toolbox's help never shows the database URL of the environment (its password).

use std::process::Command;

#[test]
fn help_does_not_show_the_database_url_of_the_environment() {
    let password = "Sup3rS3cretPw";
    let url = format!("postgres://app:{password}@db.example/ledger");
    for sub in ["verify", "copy-ceiling", "chaos", "drain", "consume-only"] {
        let out = Command::new(env!("CARGO_BIN_EXE_batch-inbox-bench"))
            .args([sub, "--help"])
            .env("DATABASE_URL", &url)
            .output()
            .expect("the binary runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{sub}: {out:?}");
        assert!(stdout.contains("DATABASE_URL"), "{sub}: {stdout}");
        assert!(
            !stdout.contains(password),
            "{sub} --help shows the password"
        );
    }
}

//! TLS to PostgreSQL, against a private server with a self-signed certificate: `sslmode=require`
//! encrypts; with `PGSSLROOTCERT` the server is verified and an unknown one is refused; the
//! default `prefer` stays plain text. The only test of this file: it sets `PGSSLROOTCERT`.

use crate::common::postgres;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use batch_inbox::db;
use batch_inbox::DbError;

/// A self-signed certificate for 127.0.0.1 and its key, as `<dir>/<name>.crt` and `.key`.
fn self_signed(dir: &Path, name: &str) {
    let ok = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(dir.join(format!("{name}.key")))
        .arg("-out")
        .arg(dir.join(format!("{name}.crt")))
        .output()
        .expect("openssl on the PATH")
        .status
        .success();
    assert!(ok, "openssl req");
}

/// Whether the session of a connection to `url` is encrypted.
async fn encrypted(url: &str) -> Result<bool, DbError> {
    let pool = db::connect(url, 1).await?;
    let c = pool.get().await?;
    let row = c
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn sslmode_require_encrypts_and_a_root_certificate_verifies_the_server() {
    let pg = postgres::PrivatePostgres::start();
    let dir = std::env::temp_dir().join(format!("ops-tls-{}-{}", std::process::id(), pg.port));
    std::fs::create_dir_all(&dir).unwrap();
    self_signed(&dir, "server");
    self_signed(&dir, "other");
    let key = dir.join("server.key");
    // The server reads its key as user postgres and refuses one others can read.
    let owner = Command::new("chown").arg("postgres").arg(&key).status();
    assert!(owner.is_ok_and(|s| s.success()) || !is_root(), "chown");
    let ok = Command::new("chmod").arg("600").arg(&key).status().unwrap();
    assert!(ok.success());

    let plain = pg.url("postgres");
    let admin = db::connect(&plain, 1).await.unwrap();
    let c = admin.get().await.unwrap();
    let cert = dir.join("server.crt");
    for (setting, value) in [("ssl_cert_file", &cert), ("ssl_key_file", &key)] {
        let sql = format!("ALTER SYSTEM SET {setting} = '{}'", value.display());
        c.batch_execute(&sql).await.unwrap();
    }
    c.batch_execute("ALTER SYSTEM SET ssl = on").await.unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c
        .query_one("SHOW ssl", &[])
        .await
        .unwrap()
        .get::<_, String>(0)
        != "on"
    {
        assert!(Instant::now() < deadline, "ssl did not turn on");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let require = format!("{plain}?sslmode=require");
    assert!(!encrypted(&plain).await.unwrap(), "prefer stays plain text");
    assert!(encrypted(&require).await.unwrap(), "require encrypts");

    std::env::set_var("PGSSLROOTCERT", &cert);
    let verified = encrypted(&require).await;
    std::env::set_var("PGSSLROOTCERT", dir.join("other.crt"));
    let unknown = encrypted(&require).await;
    std::env::set_var("PGSSLROOTCERT", dir.join("missing.crt"));
    let missing = encrypted(&require).await;
    std::env::remove_var("PGSSLROOTCERT");

    assert!(
        verified.unwrap(),
        "the server's own certificate verifies it"
    );
    let err = unknown.expect_err("a server the root certificate does not know is refused");
    assert!(
        format!("{err:?}").contains("certificate verify failed"),
        "{err:?}"
    );
    let err = missing.expect_err("a missing root certificate file is an error");
    assert!(
        matches!(err, DbError::Tls(ref m) if m.contains("missing.crt")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

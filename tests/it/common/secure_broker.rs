//! An Apache Kafka node of the security tests' own (not the suite's shared broker: with an
//! authorizer, the shared broker's anonymous clients would all need to be super users), started
//! once per test binary by the first test that asks for it (`start_secure_kafka` of
//! `scripts/kafka/lib.sh`), and stopped by its watcher once this process is gone.
//!
//! Listeners: `PLAINTEXT` (ANONYMOUS, a super user: setup and producers), `SSL` (a test CA's
//! certificate, no client certificate) and `SASL_SSL` with SCRAM-SHA-512 users `admin` (a super
//! user) and `app` (only the ACLs a test grants). The StandardAuthorizer denies what no ACL allows.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The SCRAM users and passwords created when the node's storage is formatted.
pub const ADMIN: (&str, &str) = ("admin", "admin-Pw-7f3a");
pub const APP: (&str, &str) = ("app", "app-Pw-91c2");

/// The running secure node.
pub struct SecureKafka {
    pub dir: PathBuf,
    /// PLAINTEXT listener (principal ANONYMOUS, a super user).
    pub plaintext: String,
    /// SSL listener.
    pub ssl: String,
    /// SASL_SSL listener (SCRAM-SHA-512).
    pub sasl_ssl: String,
}

impl SecureKafka {
    /// The certificate authority that signed the broker's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A certificate authority that signed nothing of the broker's.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.crt")
    }

    /// `-X` properties for the SSL listener, trusting `ca`.
    pub fn ssl_properties(ca: &Path) -> Vec<String> {
        vec![
            "security.protocol=SSL".to_owned(),
            format!("ssl.ca.location={}", ca.display()),
        ]
    }

    /// `-X` properties for the SASL_SSL listener as `user` with `password`.
    pub fn sasl_properties(&self, user: &str, password: &str) -> Vec<String> {
        vec![
            "security.protocol=SASL_SSL".to_owned(),
            format!("ssl.ca.location={}", self.ca().display()),
            "sasl.mechanism=SCRAM-SHA-512".to_owned(),
            format!("sasl.username={user}"),
            format!("sasl.password={password}"),
        ]
    }

    /// Runs Kafka's AclCommand against the PLAINTEXT listener with `args` (after `--add` or
    /// `--remove`); panics with its output when it fails.
    pub fn acl(&self, args: &[&str]) {
        let script = format!("{}/scripts/lib.sh", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new("bash")
            .arg("-c")
            .arg(
                "source \"$0\" && kafka_tool org.apache.kafka.tools.AclCommand \
                 --bootstrap-server \"$1\" --force \"${@:2}\"",
            )
            .arg(&script)
            .arg(&self.plaintext)
            .args(args)
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "AclCommand {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The node of this test binary, started on first use (about 5 s: one JVM).
pub fn secure_kafka() -> &'static SecureKafka {
    static NODE: OnceLock<SecureKafka> = OnceLock::new();
    NODE.get_or_init(start)
}

fn start() -> SecureKafka {
    let dir = std::env::temp_dir().join(format!("batch-inbox-secure-kafka-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for the secure broker");
    let script = format!("{}/scripts/lib.sh", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg("-c")
        .arg("source \"$0\" && start_secure_kafka \"$1\" \"$2\"")
        .arg(&script)
        .arg(&dir)
        .arg(std::process::id().to_string())
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "the secure Kafka node did not start (scripts/kafka/lib.sh start_secure_kafka): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(dir.join("env")).expect("the node's addresses");
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in {env}"))
            .to_owned()
    };
    SecureKafka {
        plaintext: var("PLAINTEXT_ADDR"),
        ssl: var("SSL_ADDR"),
        sasl_ssl: var("SASL_SSL_ADDR"),
        dir,
    }
}

/// A topic name of this process (`name`, the process id and a counter).
pub fn topic(name: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{name}-{}-{n}", std::process::id())
}

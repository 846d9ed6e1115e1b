//! Every default of the processor, named once: the command line's flags and the library's
//! [`crate::ProcessorConfig::new`] and [`crate::maintenance::retention::RetentionSettings::default`] all read
//! them from here.

use std::num::NonZeroUsize;
use std::time::Duration;

/// PostgreSQL when neither `--database-url` nor `DATABASE_URL` says otherwise.
pub const DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/batch_inbox";
/// Bootstrap servers.
pub const BROKERS: &str = "127.0.0.1:9092";
/// Topic consumed.
pub const TOPIC: &str = "ledger";
/// Consumer group.
pub const GROUP: &str = "batch-inbox";
/// Most records per batch.
pub const BATCH_SIZE: NonZeroUsize = NonZeroUsize::new(1000).expect("1000 is not zero");
/// Most bytes per batch (records with their overheads).
pub const BATCH_MAX_BYTES: NonZeroUsize = NonZeroUsize::new(4 << 20).expect("4 MiB is not zero");
/// When a batch closes besides its limits: natural batching won at light and heavy load in the
/// load test (docs/PERFORMANCE.md).
pub const BATCHING: crate::pipeline::batcher::Batching =
    crate::pipeline::batcher::Batching::Natural;
/// Longest wait after a batch's first record with linger batching, in milliseconds.
pub const BATCH_LINGER_MS: u64 = 20;
/// Shortest wait after a batch's first record with natural batching, in milliseconds: none, so
/// that light traffic pays no linger.
pub const NATURAL_MIN_WAIT_MS: u64 = 0;

/// The `--batch-linger-ms` of `batching` when none is given.
pub const fn linger_ms(batching: crate::pipeline::batcher::Batching) -> u64 {
    match batching {
        crate::pipeline::batcher::Batching::Linger => BATCH_LINGER_MS,
        crate::pipeline::batcher::Batching::Natural => NATURAL_MIN_WAIT_MS,
    }
}
/// How long `run`'s start-up may take (`--startup-timeout`): the database's first connection
/// retried while it is unreachable, the schema and the grants checked, the broker probed.
pub const STARTUP_TIMEOUT_FLAG: &str = "60s";
/// Database connections.
pub const POOL_SIZE: NonZeroUsize = NonZeroUsize::new(8).expect("8 is not zero");
/// Header carrying the message id.
pub const ID_HEADER: &str = "id";
/// How long a revoke waits for a partition's in-flight batch.
pub const REVOKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Store each partition's next offset in the batch's transaction too.
pub const OFFSETS_IN_DB: bool = true;
/// Seconds between two background cleanups or partition preparations.
pub const CLEANUP_INTERVAL_S: u64 = 300;
/// Most inbox rows one cleanup DELETE removes.
pub const CLEANUP_BATCH_ROWS: i64 = 5_000;
/// Pause between two cleanup DELETEs, in milliseconds.
pub const CLEANUP_PAUSE_MS: u64 = 50;
/// `lock_timeout` of partition DDL, in milliseconds.
pub const LOCK_TIMEOUT_MS: u64 = 200;
/// Daily partitions prepared ahead of today.
pub const PARTITIONS_AHEAD: u32 = 3;
/// Most daily partitions prepared ahead (a year): the flag refuses more, which would create that
/// many partitions at once.
pub const MAX_PARTITIONS_AHEAD: u32 = 366;
/// The retention of [`crate::maintenance::retention::RetentionSettings::default`] (the command line has no
/// default: `cleanup` requires one, `run` cleans nothing without one).
pub const RETENTION: Duration = Duration::from_secs(7 * 86_400);
/// Summary log line interval.
pub const LOG_INTERVAL: &str = "10s";
/// Stats file rewrite interval.
pub const STATS_INTERVAL: &str = "1s";
/// `--max-poison-rate`: more than half of a partition's last 100 messages, and more than 20
/// ([`crate::pipeline::worker::PoisonShare::DEFAULT`] and [`crate::pipeline::worker::PoisonRate::DEFAULT`] say why).
pub const MAX_POISON_RATE: &str = "50%/100,min=20";
/// `--statement-timeout`: long enough for any batch of a healthy database, short enough that
/// a stuck statement is noticed within a minute.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// [`STATEMENT_TIMEOUT`] as the flag's default.
pub const STATEMENT_TIMEOUT_FLAG: &str = "30s";

impl Default for crate::pipeline::batcher::BatcherSettings {
    /// The product's: 1000 records, 4 MiB, and the default batching's linger (none).
    fn default() -> Self {
        Self::new(
            BATCH_SIZE,
            BATCH_MAX_BYTES,
            Duration::from_millis(linger_ms(BATCHING)),
        )
    }
}

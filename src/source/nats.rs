//! The NATS JetStream source: each stream read through a durable pull consumer as one ordered
//! partition (partition 0 of a "topic" named after the stream; several streams are read side by
//! side, like Kafka's partitions), its stream sequence the position,
//! in batches pulled up to the batch size, acknowledged once per batch after its COMMIT
//! (`AckPolicy::All` on the batch's last message), kept from redelivery while a batch is held
//! with in-progress acknowledgements (`+WPI`, module `acks`).
//!
//! **One puller.** `AckPolicy::All` acknowledges every lower sequence of the consumer, and a
//! position is one number per partition: both need one instance reading the consumer at a time.
//! An instance reads only while it holds a PostgreSQL advisory lock named after the stream and
//! the consumer, on a session of its own; the others wait for it as standbys (like RabbitMQ's
//! single active consumer), so they need no coordination of their own and nothing outside the
//! database decides. An instance that loses its lock session drops its run at once (the batch
//! being committed, if any, is decided by the database's compare-and-set of the position).
//!
//! **A run** (a connection's reading of the consumer, from the lock or the last run's end):
//! - The consumer is checked (or created: durable, pull, `AckPolicy::All`, unlimited
//!   `max_deliver`, `max_ack_pending` two batches, `ack_wait` from the settings).
//! - The database's position is read (created at 0 on the first run). The consumer must stand
//!   exactly there: one that acknowledged past it (the database went back in time: a restore, a
//!   failover to a replica that lagged) or delivered past it (an earlier run's or holder's
//!   deliveries, never committed: a crash, a kill, a lost lock or connection) is deleted and
//!   created again at the database's position (`deliver_policy: by_start_sequence`, its other
//!   settings kept). JetStream would otherwise deliver the old deliveries again as their
//!   `ack_wait` ran out, interleaved with newer ones, and a reader cannot tell a gap from a
//!   delivery still to come: handing a newer one would apply the stream out of order, and with
//!   `AckPolicy::All` its ack would cover the older ones unapplied. A stream that no longer
//!   holds the position's records stops the processor, saying so.
//! - Every delivery of the consumer must come to this run: the consumer sequence grows by one for
//!   each delivery to any reader, redeliveries included. A skipped one (a holder that has not
//!   stopped yet, a pull request of a connection gone) ends the run before anything past the gap
//!   is handed; the next run creates the consumer again.
//! - So a delivery below what the run reached is one the run handed: held by a batch (left to
//!   it), or committed with its ack late, or below the database's position: acknowledged again.
//!
//! Invariant: a delivery is acknowledged only after the transaction that holds it (or its
//! duplicate's skip, or its dead letter) committed, or when the database's position is past it.

mod acks;
mod api;
mod delivery;
mod proto;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

pub use crate::error::NatsError;
use crate::error::RunError;
use crate::observe::stats::Stats;
use crate::observe::telemetry::GaugeGuard;
use crate::secret::MASK;
use crate::source::{positions, Input, OffsetSink, PartitionRun, Partitions, Source};
use acks::RunAcks;
use api::{Answer, ConsumerConfig, ConsumerInfo};
use proto::Conn;

/// A NATS URL (`nats://user:password@host:port`, `nats://token@host:port`), which may hold a
/// password or a token. `Debug` shows it with them hidden; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsUrl(String);

impl NatsUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// Whether the URL names NATS (`nats://` or `tls://`).
    pub fn is_nats(url: &str) -> bool {
        let lower = url.trim_start().to_ascii_lowercase();
        lower.starts_with("nats://") || lower.starts_with("tls://")
    }

    /// The URL with its password or token hidden, for showing. A list of servers (`,`) has
    /// each one's hidden.
    pub fn redacted(&self) -> String {
        if self.0.contains(',') {
            return self
                .0
                .split(',')
                .map(|part| NatsUrl::new(part).redacted())
                .collect::<Vec<_>>()
                .join(",");
        }
        let start = self.scheme_end();
        match (self.at(), self.userinfo()) {
            (Some(at), Some((user, Some(_)))) => {
                format!("{}{user}:{MASK}{}", &self.0[..start], &self.0[at..])
            }
            (Some(at), Some((_, None))) => format!("{}{MASK}{}", &self.0[..start], &self.0[at..]),
            _ => self.0.clone(),
        }
    }

    /// `text` with this URL's password or token replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        match self.userinfo() {
            Some((_, Some(p))) if !p.is_empty() => text.replace(&p, MASK),
            Some((token, None)) if !token.is_empty() => text.replace(&token, MASK),
            _ => text.to_owned(),
        }
    }

    fn scheme_end(&self) -> usize {
        self.0.find("://").map_or(0, |i| i + 3)
    }

    /// Where the userinfo ends (its `@`): the last `@` of the URL, so that a password holding
    /// `/`, `?`, `#` or `@` unencoded is still all of it (a host has none of them).
    fn at(&self) -> Option<usize> {
        let start = self.scheme_end();
        self.0[start..].rfind('@').map(|i| i + start)
    }

    /// (user or token, password), percent-decoded.
    fn userinfo(&self) -> Option<(String, Option<String>)> {
        let at = self.at()?;
        let info = &self.0[self.scheme_end()..at];
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        Some(match info.split_once(':') {
            Some((u, p)) => (decode(u), Some(decode(p))),
            None => (decode(info), None),
        })
    }

    /// The credentials for `CONNECT`: (user, password) or (token, `None`).
    fn credentials(&self) -> Option<(String, Option<String>)> {
        self.userinfo()
    }

    /// `host:port` (4222 when the URL gives none).
    fn address(&self) -> String {
        let start = self.at().map_or(self.scheme_end(), |i| i + 1);

        let rest = &self.0[start..];
        let host = rest.split(['/', '?']).next().unwrap_or("");
        let has_port = match host.rfind(']') {
            Some(b) => host[b..].contains(':'),
            None => host.contains(':'),
        };
        match has_port {
            true => host.to_owned(),
            false => format!("{host}:4222"),
        }
    }

    /// Whether the URL asks for TLS (`tls://`).
    fn tls(&self) -> bool {
        self.0
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("tls://")
    }
}

impl std::fmt::Debug for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("NatsUrl").field(&self.redacted()).finish()
    }
}

/// How the processor reads a JetStream stream.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NatsSettings {
    /// The server; its password or token is never shown.
    pub url: NatsUrl,
    /// The streams, each an ordered partition of its own (read by one instance at a time).
    pub streams: Vec<String>,
    /// The durable pull consumer, whose name the positions in the database are kept under
    /// (`consumer_offsets.group_id`).
    pub consumer: String,
    /// The subject the consumer reads, when the source creates it (`None`: the whole stream).
    pub filter_subject: Option<String>,
    /// The consumer's `ack_wait` when the source creates it.
    pub ack_wait: Duration,
    /// The largest batch: a pull asks for this many messages.
    pub batch_size: usize,
}

impl NatsSettings {
    /// Reading `streams` of the server at `url`, each through its durable consumer named
    /// `consumer`.
    pub fn new(url: NatsUrl, streams: Vec<String>, consumer: impl Into<String>) -> Self {
        Self {
            url,
            streams,
            consumer: consumer.into(),
            filter_subject: None,
            ack_wait: Duration::from_secs(30),
            batch_size: 1000,
        }
    }

    /// Refuses settings the source cannot run with: a stream or consumer name JetStream cannot
    /// carry in a subject, an `ack_wait` under a second, positions kept elsewhere than in the
    /// database.
    pub fn check(&self, offsets_in_db: bool) -> Result<(), NatsError> {
        if self.streams.is_empty() {
            return Err(NatsError::Settings("name at least one --stream".to_owned()));
        }
        if self.url.0.contains(',') {
            return Err(NatsError::Settings(
                "the URL names several servers (a comma list): give one; the source reconnects \
                 to it"
                    .to_owned(),
            ));
        }
        for stream in &self.streams {
            check_name("stream", stream)?;
        }
        check_name("consumer", &self.consumer)?;
        if self.ack_wait < Duration::from_secs(1) {
            return Err(NatsError::Settings(
                "--ack-wait under a second: in-progress acknowledgements could not keep a held \
                 batch from redelivery"
                    .to_owned(),
            ));
        }
        if !offsets_in_db {
            return Err(NatsError::Settings(
                "the stream sequence is kept in the database with each batch, which a restored \
                 database resumes from (--offsets-in-db must stay on)"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// Connects within `within` (connection failures are retried; a refused login ends it at
    /// once), checks the stream and the consumer (created when missing), then disconnects.
    pub async fn probe(&self, within: Duration) -> Result<(), NatsError> {
        let deadline = tokio::time::Instant::now() + within;
        let mut failures = 0u32;
        loop {
            let attempt = async {
                let conn = Conn::connect(&self.url, "batch-inbox probe", within).await?;
                let mut checked = Ok(());
                for stream in &self.streams {
                    checked = self.prepare(&conn, stream, None).await.map(|_| ());
                    if checked.is_err() {
                        break;
                    }
                }
                conn.close();
                checked
            };
            match attempt.await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_refusal() => return Err(e),
                Err(e) => {
                    failures += 1;
                    if tokio::time::Instant::now() >= deadline {
                        return Err(NatsError::Unreachable(format!(
                            "{e} (still failing after {within:?}, {failures} attempts)"
                        )));
                    }
                    tracing::warn!("NATS not ready, will retry: {e}");
                    tokio::time::sleep(backoff(failures)).await;
                }
            }
        }
    }

    /// Checks the stream (warning about settings that can drop a message while a batch
    /// stalls) and the consumer. A missing consumer is created at `start`, the database's
    /// position (what is below it is applied already), or left to the run when there is none
    /// (the probe: `None`). Returns the consumer's info (the default one when left).
    async fn prepare(
        &self,
        conn: &Conn,
        name: &str,
        start: Option<i64>,
    ) -> Result<ConsumerInfo, NatsError> {
        let stream = match api::stream_info(conn, name).await? {
            Answer::Ok(info) => info,
            Answer::Err(e) if e.err_code == api::STREAM_NOT_FOUND => {
                return Err(NatsError::Refused(format!(
                    "stream {:?} not found: create it first (its subjects and limits are the \
                     publishers' choice)",
                    name
                )))
            }
            Answer::Err(e) => return Err(NatsError::Refused(format!("stream {name:?}: {e}"))),
        };
        warn_stream(name, &stream.config);
        match api::consumer_info(conn, name, &self.consumer).await? {
            Answer::Ok(info) => {
                self.check_consumer(&info.config)?;
                Ok(info)
            }
            Answer::Err(e) if e.err_code == api::CONSUMER_NOT_FOUND => {
                let Some(start) = start else {
                    return Ok(ConsumerInfo::default());
                };
                let config = self.consumer_config(u64::try_from(start).ok().filter(|&s| s > 1));
                tracing::info!(
                    stream = %name, consumer = %self.consumer,
                    "creating the durable pull consumer (ack policy all, ack wait {:?}, max ack \
                     pending {})",
                    self.ack_wait, config.max_ack_pending
                );
                self.create(conn, name, &config).await
            }
            Answer::Err(e) => Err(NatsError::Refused(format!(
                "consumer {:?}: {e}",
                self.consumer
            ))),
        }
    }

    async fn create(
        &self,
        conn: &Conn,
        stream: &str,
        config: &ConsumerConfig,
    ) -> Result<ConsumerInfo, NatsError> {
        match api::create_consumer(conn, stream, config).await? {
            Answer::Ok(info) => Ok(info),
            Answer::Err(e) => Err(NatsError::Refused(format!(
                "cannot create consumer {:?} on stream {:?}: {e}",
                self.consumer, stream
            ))),
        }
    }

    /// The consumer the source creates: at `start` (`None`: the stream's first message).
    fn consumer_config(&self, start: Option<u64>) -> ConsumerConfig {
        ConsumerConfig {
            durable_name: Some(self.consumer.clone()),
            deliver_subject: None,
            deliver_policy: match start {
                Some(_) => "by_start_sequence".to_owned(),
                None => "all".to_owned(),
            },
            opt_start_seq: start,
            ack_policy: "all".to_owned(),
            ack_wait: i64::try_from(self.ack_wait.as_nanos()).unwrap_or(i64::MAX),
            max_deliver: -1,
            max_ack_pending: i64::try_from(self.batch_size.saturating_mul(2)).unwrap_or(i64::MAX),
            filter_subject: self.filter_subject.clone(),
            other: serde_json::Map::from_iter([(
                "replay_policy".to_owned(),
                serde_json::Value::from("instant"),
            )]),
        }
    }

    /// Refuses a consumer whose settings break the guarantee or the source's reading.
    fn check_consumer(&self, c: &ConsumerConfig) -> Result<(), NatsError> {
        let name = &self.consumer;
        let refuse = |why: String| Err(NatsError::Settings(format!("consumer {name:?}: {why}")));
        if c.deliver_subject.as_deref().is_some_and(|s| !s.is_empty()) {
            return refuse(
                "a push consumer (deliver_subject set); the source pulls: give a pull consumer's \
                 name, or a new name to have one created"
                    .to_owned(),
            );
        }
        match c.ack_policy.as_str() {
            "all" | "explicit" => {}
            other => {
                return refuse(format!(
                    "ack_policy {other:?} acknowledges a message on delivery, before its COMMIT: \
                     a crash loses it (use all or explicit)"
                ))
            }
        }
        if c.max_deliver > 0 {
            return refuse(format!(
                "max_deliver {}: a message delivered that often while a batch stalls on the \
                 database would never be delivered again, lost to the database (set it to -1)",
                c.max_deliver
            ));
        }
        let batch = i64::try_from(self.batch_size).unwrap_or(i64::MAX);
        if c.max_ack_pending > 0 && c.max_ack_pending < batch {
            return refuse(format!(
                "max_ack_pending {} is below a batch ({batch}): batches would never fill",
                c.max_ack_pending
            ));
        }
        if c.max_ack_pending <= 0 {
            return refuse(format!(
                "max_ack_pending {} is unlimited: set it to two batches ({})",
                c.max_ack_pending,
                batch.saturating_mul(2)
            ));
        }
        // A pull the consumer refuses (409) would be asked again and again.
        let limit = |key: &str| {
            c.other
                .get(key)
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0)
        };
        if limit("max_batch") > 0 && limit("max_batch") < batch {
            return refuse(format!(
                "max_batch {} is below a batch ({batch}): its pulls would be refused",
                limit("max_batch")
            ));
        }
        let expires = i64::try_from(PULL_EXPIRES.as_nanos()).unwrap_or(i64::MAX);
        if limit("max_expires") > 0 && limit("max_expires") < expires {
            return refuse(format!(
                "max_expires {} ms is below the source's pull expiry ({} ms): its pulls would be \
                 refused",
                limit("max_expires") / 1_000_000,
                PULL_EXPIRES.as_millis()
            ));
        }
        if limit("max_bytes") > 0 {
            return refuse(format!(
                "max_bytes {}: a pull of a batch could exceed it and be refused; unset it",
                limit("max_bytes")
            ));
        }
        if let (Some(want), Some(have)) = (&self.filter_subject, &c.filter_subject) {
            if want != have {
                return refuse(format!(
                    "it reads {have:?}, not --filter-subject {want:?}; a consumer's filter is its \
                     own"
                ));
            }
        }
        if c.ack_wait > 0 && c.ack_wait < 1_000_000_000 {
            return refuse(format!(
                "ack_wait {} ms is under a second: in-progress acknowledgements could not keep a \
                 held batch from redelivery",
                c.ack_wait / 1_000_000
            ));
        }
        Ok(())
    }
}

/// A stream or consumer name: a subject token (no `.`, `*`, `>`, blanks or control bytes), at
/// most 255 bytes.
fn check_name(what: &str, name: &str) -> Result<(), NatsError> {
    let bad =
        |c: char| matches!(c, '.' | '*' | '>' | '/' | '\\') || c.is_whitespace() || c.is_control();
    if name.is_empty() || name.len() > 255 || name.chars().any(bad) {
        return Err(NatsError::Settings(format!(
            "{what} name {name:?}: 1 to 255 bytes without '.', '*', '>', slashes, blanks or \
             control characters"
        )));
    }
    Ok(())
}

/// Warns about a stream's settings that can remove a message before it is applied (while a
/// batch stalls on the database) or that a restored database cannot read again.
fn warn_stream(stream: &str, c: &api::StreamConfig) {
    if c.max_age > 0 {
        tracing::warn!(
            stream,
            max_age_s = c.max_age / 1_000_000_000,
            "the stream removes messages older than its max_age, applied or not: a stall on the \
             database longer than that loses them"
        );
    }
    let limited = c.max_msgs > 0 || c.max_bytes > 0 || c.max_msgs_per_subject > 0;
    if limited && c.discard != "new" {
        tracing::warn!(
            stream,
            "the stream discards its oldest messages at its limits (max_msgs, max_bytes, \
             max_msgs_per_subject), applied or not: while a batch stalls, a full stream loses \
             them (discard new refuses publishers instead)"
        );
    }
    match c.retention.as_str() {
        "workqueue" | "interest" => tracing::warn!(
            stream,
            retention = %c.retention,
            "the stream deletes a message once it is acknowledged: a database restored from a \
             backup cannot read again what was acknowledged after it (limits retention keeps them)"
        ),
        _ => {}
    }
}

/// The delay before the `failures`-th retry: 100 ms doubling, at most 5 s.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100u64 << failures.min(6)).min(Duration::from_secs(5))
}

/// A run shorter than this counts as a failure for the backoff.
const SHORT_RUN: Duration = Duration::from_secs(1);

/// How long a pull request waits for messages, and with `--exit-on-eof` (when an empty answer
/// is the end).
const PULL_EXPIRES: Duration = Duration::from_secs(5);
const PULL_EXPIRES_EOF: Duration = Duration::from_millis(250);

/// How long after a pull's expiry its answer may be late before the pull is sent again
/// (nats-server 2.9.10 sometimes never answers a pull that waited for acknowledgements to free
/// `max_ack_pending`), and how long the connection may stay silent before a request checks it.
const PULL_ANSWER: Duration = Duration::from_secs(1);
const PULL_GRACE: Duration = Duration::from_secs(10);

/// How often `--exit-on-eof` looks whether the consumer is drained.
const DRAIN_POLL: Duration = Duration::from_millis(250);

/// How often a standby asks for the lock.
const LOCK_POLL: Duration = Duration::from_secs(1);

/// How often the holder checks its lock's session, and how long a check may take: a holder
/// whose session is gone (or does not answer) drops its run and closes its NATS connection
/// within [`LEASE`] of the session's end.
const LOCK_CHECK: Duration = Duration::from_millis(LOCK_CHECK_MS);
const LOCK_CHECK_TIMEOUT: Duration = Duration::from_millis(LOCK_CHECK_TIMEOUT_MS);
const LOCK_CHECK_MS: u64 = 500;
const LOCK_CHECK_TIMEOUT_MS: u64 = 1000;
const LEASE: Duration = Duration::from_millis(LOCK_CHECK_MS + LOCK_CHECK_TIMEOUT_MS);

/// How long a new holder waits after taking the lock before it touches the consumer: longer
/// than [`LEASE`], so that a holder whose session the database ended (while its own connection
/// to the database hung, unaware) has stopped pulling and keeping deliveries in progress.
const TAKEOVER_WAIT: Duration = Duration::from_millis(LOCK_CHECK_MS + LOCK_CHECK_TIMEOUT_MS + 1000);

/// A JetStream stream as a [`Source`]. Its settings were checked ([`NatsSettings::check`]).
pub(crate) struct NatsSource {
    /// The server, the stream and the consumer.
    pub settings: NatsSettings,
    /// Return once the consumer has nothing pending or unacknowledged and every record read is
    /// committed.
    pub exit_on_eof: bool,
    /// The database: the positions, and the lock that makes one instance read.
    pub pool: Pool,
    /// What the run counts.
    pub stats: Arc<Stats>,
}

impl Source for NatsSource {
    async fn run(
        self,
        partitions: Arc<dyn Partitions>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let stop = CancellationToken::new();
        let mut readers = tokio::task::JoinSet::new();
        for stream in &self.settings.streams {
            let reader = Reader {
                stream: Arc::from(stream.as_str()),
                settings: self.settings.clone(),
                pool: self.pool.clone(),
                stats: self.stats.clone(),
                partitions: partitions.clone(),
                exit_on_eof: self.exit_on_eof,
                // With --exit-on-eof a drained stream's reader ends alone; the others go on.
                stop: stop.child_token(),
            };
            readers.spawn(reader.run());
        }
        tokio::pin!(shutdown);
        let mut result = Ok(());
        loop {
            tokio::select! {
                _ = &mut shutdown, if !stop.is_cancelled() => stop.cancel(),
                ended = readers.join_next() => match ended {
                    None => break,
                    Some(Ok(Ok(()))) => {}
                    Some(Ok(Err(e))) => {
                        stop.cancel();
                        if result.is_ok() {
                            result = Err(e);
                        }
                    }
                    Some(Err(e)) => {
                        stop.cancel();
                        if result.is_ok() {
                            result = Err(RunError::Nats(NatsError::Unreachable(format!(
                                "a stream's reader ended: {e}"
                            ))));
                        }
                    }
                },
            }
        }
        result
    }
}

/// The stream's reader: a run after another while this instance holds the lock.
struct Reader {
    stream: Arc<str>,
    settings: NatsSettings,
    pool: Pool,
    stats: Arc<Stats>,
    partitions: Arc<dyn Partitions>,
    exit_on_eof: bool,
    stop: CancellationToken,
}

/// How a run ended.
enum Ended {
    /// The source stops (shutdown, or drained with `--exit-on-eof`).
    Stop,
    /// Start another run (a lost connection, a rewind).
    Again,
    /// The lock's session is gone: wait for the lock again.
    LockLost,
}

impl Reader {
    async fn run(self) -> Result<(), RunError> {
        let mut failures = 0u32;
        // Once a run has read the stream, a JetStream API error (a leader election, JetStream
        // unavailable for a while, a permission being changed) is waited out, not a stop.
        let mut read = false;
        'lock: while !self.stop.is_cancelled() {
            // The stream counts as assigned (`/readyz`, the assigned-partitions gauge) from the
            // lock's waiting to the run's start, and between runs; once a run starts, it counts.
            let Some((lock, waiting)) = self.lock().await else {
                break;
            };
            let mut between = Some(waiting);
            // An earlier holder whose session ended without its knowing stops within the lease.
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = tokio::time::sleep(TAKEOVER_WAIT) => {}
            }
            while !self.stop.is_cancelled() {
                let began = std::time::Instant::now();
                if between.is_none() {
                    between = Some(self.stats.telemetry.partition_assigned());
                }
                let ended = tokio::select! {
                    ended = self.one_run(lock.lease.clone(), &mut between) => ended,
                    _ = lock.lost() => Ok(Ended::LockLost),
                };
                let ended = match ended {
                    Ok(e) => {
                        read = true;
                        e
                    }
                    Err(RunErrorOr::Nats(NatsError::Refused(e))) if read => {
                        failures += 1;
                        tracing::warn!(stream = %self.stream, "JetStream refused, will retry: {e}");
                        tokio::select! {
                            _ = self.stop.cancelled() => break 'lock,
                            _ = tokio::time::sleep(backoff(failures)) => {}
                        }
                        continue;
                    }
                    Err(e) if e.is_refusal() => return Err(e.into()),
                    Err(RunErrorOr::Run(e)) => return Err(e),
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(stream = %self.stream, "cannot read the stream, will retry: {e}");
                        tokio::select! {
                            _ = self.stop.cancelled() => break 'lock,
                            _ = tokio::time::sleep(backoff(failures)) => {}
                        }
                        continue;
                    }
                };
                match ended {
                    Ended::Stop => break 'lock,
                    Ended::LockLost => {
                        tracing::warn!(
                            stream = %self.stream,
                            "the database session holding the stream's lock is gone: the run \
                             was dropped; reading again once the lock is held"
                        );
                        continue 'lock;
                    }
                    Ended::Again => {}
                }
                match began.elapsed() < SHORT_RUN {
                    true => {
                        failures += 1;
                        tokio::select! {
                            _ = self.stop.cancelled() => break 'lock,
                            _ = tokio::time::sleep(backoff(failures)) => {}
                        }
                    }
                    false => failures = 0,
                }
            }
        }
        Ok(())
    }

    /// The advisory lock of the stream and consumer, on a session of its own; `None`: stopping.
    /// A standby waits here, counted as assigned (`/readyz`), asking on the same session every
    /// [`LOCK_POLL`]. Returned with the lock: the guard that counts it as assigned.
    async fn lock(&self) -> Option<(StreamLock, GaugeGuard)> {
        let waiting = self.stats.telemetry.partition_assigned();
        let key = lock_key(&self.stream, &self.settings.consumer);
        let mut told = false;
        let mut failures = 0u32;
        let mut session: Option<deadpool_postgres::ClientWrapper> = None;
        loop {
            let attempt = async {
                let client = match session.take() {
                    Some(c) => c,
                    None => {
                        let object = self.pool.get().await.map_err(|e| e.to_string())?;
                        deadpool_postgres::Object::take(object)
                    }
                };
                let row = tokio::time::timeout(
                    LOCK_CHECK_TIMEOUT * 5,
                    client.query_one("SELECT pg_try_advisory_lock($1)", &[&key]),
                )
                .await
                .map_err(|_| "no answer within 5 s".to_owned())?
                .map_err(|e| e.to_string())?;
                Ok::<_, String>((client, row.get::<_, bool>(0)))
            };
            match attempt.await {
                Ok((client, true)) => return Some((StreamLock::held(client), waiting)),
                Ok((client, false)) => {
                    session = Some(client);
                    if !told {
                        tracing::info!(
                            stream = %self.stream, consumer = %self.settings.consumer,
                            "another instance reads the consumer: standing by"
                        );
                        told = true;
                    }
                    failures = 0;
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(stream = %self.stream, "cannot take the stream's lock in the database, will retry: {e}");
                }
            }
            tokio::select! {
                _ = self.stop.cancelled() => return None,
                _ = tokio::time::sleep(backoff(failures).max(LOCK_POLL)) => {}
            }
        }
    }

    /// One connection's run of the consumer.
    async fn one_run(
        &self,
        lease: Arc<Lease>,
        between: &mut Option<GaugeGuard>,
    ) -> Result<Ended, RunErrorOr> {
        let s = &self.settings;
        let conn = tokio::select! {
            _ = self.stop.cancelled() => return Ok(Ended::Stop),
            c = Conn::connect(&s.url, "batch-inbox", Duration::from_secs(30)) => c?,
        };
        let _close = CloseOnDrop(conn.clone());
        let Some(start) = self.start_position().await else {
            return Ok(Ended::Stop);
        };
        let info = s.prepare(&conn, &self.stream, Some(start)).await?;
        // The consumer is exactly at the database's position: nothing delivered past it (an
        // earlier run's or holder's deliveries, which JetStream would deliver again after
        // `ack_wait`, out of order with newer ones) and nothing acknowledged past it.
        let info = self.align_consumer(&conn, info, start).await?;
        let ack_wait = Duration::from_nanos(u64::try_from(info.config.ack_wait).unwrap_or(0))
            .max(Duration::from_secs(1));
        let (acks, progress) = RunAcks::new(
            conn.clone(),
            info.config.ack_policy == "all",
            ack_wait,
            lease,
            self.stats.clone(),
        );
        let sink: Arc<dyn OffsetSink> = acks.clone();
        let run: PartitionRun = self
            .partitions
            .start(self.stream.clone(), 0, Some(start), sink);
        // The run counts the stream as assigned from here.
        drop(between.take());
        let run_stop = run.stop.clone();
        let at_eof = run.at_eof.clone();
        // A channel without tokio's cooperative budget: natural batching takes every record
        // ready without yielding (`now_or_never`), and tokio's mpsc would answer "not ready"
        // after 128 of them, cutting every batch there.
        let (tx, rx) = futures::channel::mpsc::unbounded::<Input>();
        let feed = Feed {
            conn: conn.clone(),
            stream: self.stream.clone(),
            consumer: s.consumer.clone(),
            batch: s.batch_size,
            eof: self.exit_on_eof,
            start,
            next_delivery: info.delivered.consumer_seq.saturating_add(1),
            acks: acks.clone(),
            stats: self.stats.clone(),
        };
        let feeding = tokio::spawn(feed.run(tx));
        let body = run.run.run(rx.boxed());
        tokio::pin!(body);
        let mut drained_check = tokio::time::interval(DRAIN_POLL);
        let mut stopping = false;
        let result = loop {
            tokio::select! {
                r = &mut body => break r,
                _ = self.stop.cancelled(), if !stopping => {
                    stopping = true;
                    acks.ended.cancel();
                    run_stop.cancel();
                }
                _ = drained_check.tick(), if self.exit_on_eof && !stopping => {
                    let drained = consumer_drained(&conn, &self.stream, &s.consumer);
                    if at_eof.load(Ordering::Acquire)
                        && tokio::time::timeout(DRAIN_POLL * 4, drained).await.unwrap_or(false)
                    {
                        self.stop.cancel();
                    }
                }
            }
        };
        acks.ended.cancel();
        let _ = feeding.await;
        // What the run still holds was not committed: delivered again at once.
        acks.nak_held();
        progress.abort();
        // Let the acks and NAKs leave before the connection closes.
        conn.flush().await;
        drop(acks);
        result?;
        match self.stop.is_cancelled() {
            true => Ok(Ended::Stop),
            false => Ok(Ended::Again),
        }
    }

    /// The database's position of the stream (created at 0 on the first run), read again
    /// while the database fails; `None`: stopping.
    async fn start_position(&self) -> Option<i64> {
        positions::claim_until_stopped(
            &self.pool,
            &self.settings.consumer,
            &self.stream,
            &self.stop,
        )
        .await
    }

    /// Puts the consumer at the database's position, which is the system of record: the
    /// consumer is deleted and created again there (2.9 has no reset; its other settings are
    /// kept) when it acknowledged past the position (the database went back in time: a
    /// restore, a failover to a replica that lagged) or delivered past it (an earlier run's or
    /// holder's deliveries, never committed: JetStream would deliver them again as their
    /// `ack_wait` ran out, interleaved with newer ones, and a reader cannot tell a gap from a
    /// delivery still to come). Created again, it delivers every record from the position, in
    /// order, once. Returns the consumer's info.
    async fn align_consumer(
        &self,
        conn: &Conn,
        info: ConsumerInfo,
        start: i64,
    ) -> Result<ConsumerInfo, RunErrorOr> {
        let s = &self.settings;
        let first = u64::try_from(start.max(1)).unwrap_or(1);
        let went_back = info.ack_floor.stream_seq >= first;
        if !went_back && info.delivered.stream_seq < first {
            return Ok(info);
        }
        let name = &*self.stream;
        let stream = match api::stream_info(conn, name).await? {
            Answer::Ok(i) => i,
            Answer::Err(e) => {
                return Err(NatsError::Refused(format!("stream {name:?}: {e}")).into())
            }
        };
        if stream.state.first_seq > first && stream.state.messages > 0 {
            return Err(RunErrorOr::Run(RunError::Nats(NatsError::Refused(
                format!(
                    "the database's position of stream {:?} is {start}, below what consumer {:?} \
                 delivered ({}) or acknowledged ({}), and the stream no longer holds sequences \
                 {first} to {} (its first is {}): those records are lost to the database; \
                 restore a newer backup or move the position (`positions set`)",
                    name,
                    s.consumer,
                    info.delivered.stream_seq,
                    info.ack_floor.stream_seq,
                    stream.state.first_seq - 1,
                    stream.state.first_seq,
                ),
            ))));
        }
        if went_back {
            tracing::warn!(
                stream = %name, consumer = %s.consumer,
                database = start, acknowledged = info.ack_floor.stream_seq,
                "the database's position is below what the consumer acknowledged (a restore, a \
                 failover to a replica that lagged): creating the consumer again at the \
                 database's position; the inbox skips what the database holds"
            );
            self.stats
                .record_rewind(info.ack_floor.stream_seq.saturating_sub(first) + 1);
        } else {
            // A warning: the reader before this run stopped with deliveries it never committed
            // (a crash, a kill, a lost lock or connection), which operators want to see.
            tracing::warn!(
                stream = %name, consumer = %s.consumer,
                database = start, delivered = info.delivered.stream_seq,
                unacknowledged = info.num_ack_pending,
                "the consumer delivered past the database's position what no run committed (an \
                 earlier run or holder): creating it again at the position, so that the stream \
                 is read in order from there"
            );
        }
        let mut config = info.config.clone();
        config.deliver_policy = "by_start_sequence".to_owned();
        config.opt_start_seq = Some(first);
        config.other.remove("opt_start_time");
        match api::delete_consumer(conn, name, &s.consumer).await? {
            Answer::Ok(_) => {}
            Answer::Err(e) if e.err_code == api::CONSUMER_NOT_FOUND => {}
            Answer::Err(e) => {
                return Err(NatsError::Refused(format!(
                    "cannot delete consumer {:?} to create it at {first}: {e}",
                    s.consumer
                ))
                .into())
            }
        }
        Ok(s.create(conn, name, &config).await?)
    }
}

/// Whether the consumer has nothing pending and nothing unacknowledged.
async fn consumer_drained(conn: &Conn, stream: &str, consumer: &str) -> bool {
    match api::consumer_info(conn, stream, consumer).await {
        Ok(Answer::Ok(info)) => info.num_pending == 0 && info.num_ack_pending == 0,
        Ok(Answer::Err(e)) => {
            tracing::debug!("cannot read the consumer's info: {e}");
            false
        }
        Err(e) => {
            tracing::debug!("cannot read the consumer's info: {e}");
            false
        }
    }
}

/// A NATS failure or a run's own error.
#[derive(Debug)]
enum RunErrorOr {
    Nats(NatsError),
    Run(RunError),
}

impl RunErrorOr {
    fn is_refusal(&self) -> bool {
        matches!(self, RunErrorOr::Nats(e) if e.is_refusal())
    }
}

impl From<NatsError> for RunErrorOr {
    fn from(e: NatsError) -> Self {
        RunErrorOr::Nats(e)
    }
}

impl From<RunError> for RunErrorOr {
    fn from(e: RunError) -> Self {
        RunErrorOr::Run(e)
    }
}

impl std::fmt::Display for RunErrorOr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunErrorOr::Nats(e) => e.fmt(f),
            RunErrorOr::Run(e) => e.fmt(f),
        }
    }
}

impl From<RunErrorOr> for RunError {
    fn from(e: RunErrorOr) -> Self {
        match e {
            RunErrorOr::Nats(e) => RunError::Nats(e),
            RunErrorOr::Run(e) => e,
        }
    }
}

/// Closes a connection when the run that opened it ends.
struct CloseOnDrop(Conn);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The advisory lock's key of `stream` and `consumer`: one reader at a time.
fn lock_key(stream: &str, consumer: &str) -> i64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("batch-inbox jetstream {stream} {consumer}"));
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// A held advisory lock: its session, taken out of the pool (closing it releases the lock).
struct StreamLock {
    lost: CancellationToken,
    watch: tokio::task::JoinHandle<()>,
    /// When the session last answered.
    lease: Arc<Lease>,
}

/// When the lock's session last answered its holder's check.
pub(crate) struct Lease {
    since: std::time::Instant,
    last_ok_ms: std::sync::atomic::AtomicU64,
}

impl Lease {
    fn new() -> Self {
        Self {
            since: std::time::Instant::now(),
            last_ok_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn renew(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ok_ms.store(ms, Ordering::Release);
    }

    /// Whether the session answered within [`LEASE`]: a process that was paused (SIGSTOP, a
    /// frozen host) and wakes with its session gone must not keep deliveries in progress
    /// before its check notices, or a new holder would pull past them.
    pub(crate) fn fresh(&self) -> bool {
        let now = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_ok_ms.load(Ordering::Acquire);
        now.saturating_sub(last) < u64::try_from(LEASE.as_millis()).unwrap_or(u64::MAX)
    }
}

impl StreamLock {
    /// The lock held by `client`'s session, watched.
    fn held(client: deadpool_postgres::ClientWrapper) -> Self {
        let lost = CancellationToken::new();
        let lease = Arc::new(Lease::new());
        let watch = {
            let lost = lost.clone();
            let lease = lease.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(LOCK_CHECK).await;
                    let alive =
                        tokio::time::timeout(LOCK_CHECK_TIMEOUT, client.simple_query("SELECT 1"))
                            .await
                            .is_ok_and(|r| r.is_ok());
                    if alive {
                        lease.renew();
                    }
                    if !alive {
                        // Within LEASE of the session's end: the run is dropped and its NATS
                        // connection closed before a new holder's TAKEOVER_WAIT is over.
                        debug_assert!(LEASE < TAKEOVER_WAIT);
                        lost.cancel();
                        return;
                    }
                }
            })
        };
        Self { lost, watch, lease }
    }

    /// Resolves when the lock's session is gone.
    async fn lost(&self) {
        self.lost.cancelled().await
    }
}

impl Drop for StreamLock {
    fn drop(&mut self) {
        // The session closes with its task: the lock is released.
        self.watch.abort();
    }
}

/// The consumer's deliveries as the run's input: pulls, one at a time, of up to a batch.
struct Feed {
    conn: Conn,
    stream: Arc<str>,
    consumer: String,
    batch: usize,
    eof: bool,
    start: i64,
    /// The consumer sequence the next delivery must carry: every delivery of the consumer
    /// comes to this run, or the run ends.
    next_delivery: u64,
    acks: Arc<RunAcks>,
    stats: Arc<Stats>,
}

impl Feed {
    async fn run(mut self, tx: futures::channel::mpsc::UnboundedSender<Input>) {
        let inbox = self.conn.new_inbox();
        let (_sid, mut deliveries) = self.conn.subscribe(&inbox);
        let next_subject = format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
            self.stream, self.consumer
        );
        let expires = if self.eof {
            PULL_EXPIRES_EOF
        } else {
            PULL_EXPIRES
        };
        let request = serde_json::json!({
            "batch": self.batch,
            "expires": u64::try_from(expires.as_nanos()).unwrap_or(u64::MAX),
        })
        .to_string();
        let mut next = self.start;
        let mut outstanding = 0usize;
        let mut received = 0usize;
        let mut refused = 0u32;
        let mut deadline = tokio::time::Instant::now();
        let mut heard = tokio::time::Instant::now();
        loop {
            if outstanding == 0 {
                // A refused pull (409) is asked again after a backoff, never in a tight loop.
                if refused > 0 {
                    tokio::select! {
                        _ = self.acks.ended.cancelled() => return,
                        _ = tokio::time::sleep(backoff(refused)) => {}
                    }
                }
                // At most two batches held: a stalled pipeline stops the pulls (the consumer's
                // max_ack_pending may be larger than the source's).
                while self.acks.held() >= self.batch.saturating_mul(2) {
                    tokio::select! {
                        _ = self.acks.ended.cancelled() => return,
                        _ = self.acks.released() => {}
                    }
                }
                if !self.conn.publish(
                    next_subject.as_bytes(),
                    Some(inbox.as_bytes()),
                    request.as_bytes(),
                ) {
                    return;
                }
                outstanding = self.batch;
                received = 0;
                deadline = tokio::time::Instant::now() + expires + PULL_ANSWER;
            }
            let msg = tokio::select! {
                _ = self.acks.ended.cancelled() => return,
                _ = tokio::time::sleep_until(deadline) => {
                    // No answer: ask again; after a long silence, a request of the API tells a
                    // live connection from a lost one.
                    if heard.elapsed() >= PULL_GRACE {
                        let alive = tokio::time::timeout(
                            PULL_GRACE,
                            api::consumer_info(&self.conn, &self.stream, &self.consumer),
                        )
                        .await;
                        if !matches!(alive, Ok(Ok(_))) {
                            tracing::warn!(
                                stream = %self.stream,
                                "no answer from the server within {:?}: the connection counts as lost",
                                PULL_GRACE * 2
                            );
                            self.conn.close();
                            return;
                        }
                        heard = tokio::time::Instant::now();
                    }
                    outstanding = 0;
                    continue;
                }
                msg = deliveries.recv() => match msg {
                    Some(m) => m,
                    None => return,
                },
            };
            heard = tokio::time::Instant::now();
            let info = msg.reply.as_deref().and_then(delivery::ack_info);
            let Some(info) = info else {
                match delivery::status(&msg) {
                    Some((100, _)) => {}
                    Some((404 | 408, _)) => {
                        outstanding = 0;
                        if received == 0 && self.eof && tx.unbounded_send(Input::Eof).is_err() {
                            return;
                        }
                    }
                    Some((409, description)) => {
                        outstanding = 0;
                        if description.to_ascii_lowercase().contains("deleted") {
                            tracing::info!(stream = %self.stream, "pull ended: {description}");
                            return;
                        }
                        refused += 1;
                        match refused {
                            1 => {
                                tracing::warn!(stream = %self.stream, "pull refused: {description}; asking again after a backoff")
                            }
                            _ => {
                                tracing::debug!(stream = %self.stream, "pull refused: {description}")
                            }
                        }
                    }
                    other => {
                        tracing::debug!(stream = %self.stream, "a message without a record: {other:?}");
                    }
                }
                continue;
            };
            outstanding = outstanding.saturating_sub(1);
            received += 1;
            refused = 0;
            if info.delivered > 1 {
                self.stats.telemetry.record_redelivery();
            }
            // A consumer sequence skipped: a delivery went to another reader (a holder that
            // has not stopped yet, a pull request of a connection gone). What it took comes
            // back after `ack_wait`, below what this run would have handed by then: the run
            // ends before handing anything past the gap, and the next one creates the
            // consumer again at the database's position.
            if info.consumer_seq != self.next_delivery {
                tracing::warn!(
                    stream = %self.stream, expected = self.next_delivery,
                    got = info.consumer_seq, sequence = info.stream_seq,
                    "a delivery of the consumer went to another reader: reading again from the \
                     database's position"
                );
                self.acks.ended.cancel();
                return;
            }
            self.next_delivery += 1;
            let seq = i64::try_from(info.stream_seq).unwrap_or(i64::MAX);
            let reply = msg.reply.clone().unwrap_or_default();
            if seq < next {
                // Every delivery of the consumer came to this run: one below what the run
                // handed is held by a batch of the run (left to it), committed by the run with
                // its ack late, or below the database's position (acknowledged again).
                self.acks.delivered_again(seq, reply);
                continue;
            }
            next = seq.saturating_add(1);
            self.acks.hold(seq, reply);
            if tx
                .unbounded_send(Input::Record(delivery::to_raw(&self.stream, info, msg)))
                .is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;

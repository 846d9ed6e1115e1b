//! The RabbitMQ source: each queue an ordered stream (like a Kafka partition: partition 0 of a
//! "topic" named after the queue), read on a channel of its own with one consumer, in batches
//! the pipeline forms from the deliveries ready, acknowledged with one `basic.ack` (`multiple`)
//! after each batch's COMMIT (`acks`), the delivery's properties and headers as the record's
//! (`delivery`).
//!
//! Positions: RabbitMQ has none, so a queue's channel numbers its deliveries from the next
//! position the database holds for the queue, read when the channel's first delivery arrives
//! (position = base + delivery tag − 1), and each batch's transaction stores the number after its
//! last record, compare-and-set, as it does Kafka's offsets (module `source`). A channel is a
//! partition's run: when it closes (the broker restarted, the connection dropped, the
//! `consumer_timeout` passed, a rewind) the run commits what it read and ends, its
//! unacknowledged deliveries go back to the queue, and a new channel starts a new run. Nothing is
//! acknowledged before its COMMIT, and an acknowledgement never goes to another channel than the
//! one that delivered it (the client refuses an acker of a closed channel; its automatic recovery
//! is off).
//!
//! Each queue is declared at start and on every channel, durable, with
//! `x-single-active-consumer` (one instance reads the queue at a time; another takes over when
//! it is gone, so the queue's order holds) and its type (`x-queue-type`). A queue that exists
//! with other arguments (a `x-delivery-limit`, a message TTL, a `max-length`, `x-expires`,
//! another type) is refused with the broker's words (`PRECONDITION_FAILED - inequivalent arg`):
//! such settings can drop a message while a partition stalls on the database.
//!
//! Invariant: a delivery is acknowledged only after the transaction that holds it (or its
//! duplicate's skip, or its dead letter) committed, on the channel that delivered it.

mod acks;
mod delivery;
mod wire;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::{Stream, StreamExt};
use lapin::options::{BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, Consumer};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use crate::error::AmqpError;
use crate::error::RunError;
use crate::observe::stats::Stats;
use crate::secret::MASK;
use crate::source::{positions, Input, OffsetSink, PartitionRun, Partitions, Source};
use acks::{Acknowledged, ChannelAcks};

/// A RabbitMQ URL (`amqp://user:password@host:port/vhost`, or `amqps://`), which may hold a
/// password. `Debug` shows it with the password hidden; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpUrl(String);

impl AmqpUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL in clear, for the client only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its password hidden, for showing.
    pub fn redacted(&self) -> String {
        crate::secret::redact_database_url(&self.0)
    }

    /// `text` with this URL's password (when it has one) replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        let password = self.password();
        match password.as_deref() {
            Some(p) if !p.is_empty() && text.contains(p) => text.replace(p, MASK),
            _ => text.to_owned(),
        }
    }

    /// The password the client would use, when the URL parses and has one.
    fn password(&self) -> Option<String> {
        let uri: lapin::uri::AMQPUri = self.0.parse().ok()?;
        Some(uri.authority.userinfo.password).filter(|p| !p.is_empty())
    }

    /// Whether the URL names RabbitMQ (`amqp://` or `amqps://`).
    pub fn is_amqp(url: &str) -> bool {
        let lower = url.trim_start().to_ascii_lowercase();
        lower.starts_with("amqp://") || lower.starts_with("amqps://")
    }
}

impl std::fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AmqpUrl").field(&self.redacted()).finish()
    }
}

/// The type of the queues, declared with them (`x-queue-type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueType {
    /// A classic queue (RabbitMQ's default).
    #[default]
    Classic,
    /// A quorum queue (replicated; its `x-delivery-limit` must stay unset).
    Quorum,
}
crate::names::named!(QueueType {
    Classic = "classic",
    Quorum = "quorum"
});

/// How the processor reads RabbitMQ.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AmqpSettings {
    /// The broker; its password is never shown.
    pub url: AmqpUrl,
    /// The queues, each an ordered stream of its own.
    pub queues: Vec<String>,
    /// The reader's name, which the positions in the database are kept under
    /// (`consumer_offsets.group_id`).
    pub reader: String,
    /// The queues' type, declared with them.
    pub queue_type: QueueType,
    /// Deliveries unacknowledged at most per queue (`basic.qos`): twice the batch size by
    /// default, so that the next batch fills while one commits.
    pub prefetch: u16,
}

impl AmqpSettings {
    /// Reading `queues` of the broker at `url`, under the reader name `reader`.
    pub fn new(url: AmqpUrl, queues: Vec<String>, reader: impl Into<String>) -> Self {
        Self {
            url,
            queues,
            reader: reader.into(),
            queue_type: QueueType::default(),
            prefetch: 2000,
        }
    }

    /// The prefetch for batches of at most `batch_size` records: two batches (at most 65,535,
    /// AMQP's limit).
    pub fn prefetch_for(batch_size: usize) -> u16 {
        u16::try_from(batch_size.saturating_mul(2)).unwrap_or(u16::MAX)
    }

    /// Refuses settings the source cannot run with: no queue, a queue name AMQP cannot carry or
    /// RabbitMQ reserves, a zero prefetch, positions kept elsewhere than in the database.
    pub fn check(&self, offsets_in_db: bool) -> Result<(), AmqpError> {
        if self.queues.is_empty() {
            return Err(AmqpError::Settings("name at least one --queue".to_owned()));
        }
        for q in &self.queues {
            check_queue_name(q).map_err(AmqpError::Settings)?;
        }
        if self.prefetch == 0 {
            return Err(AmqpError::Settings(
                "a prefetch of 0 is unlimited in AMQP; give a bound".to_owned(),
            ));
        }
        if !offsets_in_db {
            return Err(AmqpError::Settings(
                "a RabbitMQ queue has no positions of its own: they are numbered from the \
                 database's (--offsets-in-db must stay on)"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// Connects and declares every queue within `within` (connection failures are retried; a
    /// refused login, vhost or queue declaration ends it at once), then disconnects.
    pub async fn probe(&self, within: Duration) -> Result<(), AmqpError> {
        let deadline = tokio::time::Instant::now() + within;
        let mut failures = 0u32;
        loop {
            match self.probe_once().await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_refusal() => return Err(e),
                Err(e) => {
                    failures += 1;
                    if tokio::time::Instant::now() >= deadline {
                        return Err(AmqpError::Unreachable(format!(
                            "{e} (still failing after {within:?}, {failures} attempts)"
                        )));
                    }
                    tracing::warn!("RabbitMQ not ready, will retry: {e}");
                    tokio::time::sleep(backoff(failures)).await;
                }
            }
        }
    }

    async fn probe_once(&self) -> Result<(), AmqpError> {
        let connection = connect(&self.url).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| self.error(e))?;
        for q in &self.queues {
            declare(&channel, q, self.queue_type)
                .await
                .map_err(|e| self.error(e))?;
        }
        let _ = connection.close(200, ShortString::from("probe done")).await;
        Ok(())
    }

    /// A client error, classified, without the URL's password.
    fn error(&self, e: lapin::Error) -> AmqpError {
        classify(&self.url, e)
    }
}

/// A queue name AMQP can carry (1 to 255 bytes), without NUL (PostgreSQL's text keeps the
/// positions under it), and not of RabbitMQ's own (`amq.`).
fn check_queue_name(q: &str) -> Result<(), String> {
    if q.is_empty() || q.len() > 255 {
        return Err(format!(
            "queue name {q:?}: 1 to 255 bytes (AMQP's short string)"
        ));
    }
    if q.contains('\0') {
        return Err(format!("queue name {q:?}: holds a NUL character"));
    }
    if q.starts_with("amq.") {
        return Err(format!(
            "queue name {q:?}: the amq. prefix is RabbitMQ's own (server-named queues are \
             exclusive to their connection and gone with it)"
        ));
    }
    Ok(())
}

/// A client error as an [`AmqpError`]: a refusal by the broker (access refused, not found,
/// precondition failed, not allowed, invalid path) or a failure to retry.
fn classify(url: &AmqpUrl, e: lapin::Error) -> AmqpError {
    let text = url.scrub(&e.to_string());
    let refused = match e.kind() {
        lapin::ErrorKind::ProtocolError(p) if p.get_id() == 404 => {
            return AmqpError::NotFound(text)
        }
        lapin::ErrorKind::ProtocolError(p) => {
            matches!(p.get_id(), 402 | 403 | 406 | 530)
        }
        lapin::ErrorKind::AuthProviderError(_) => true,
        _ => false,
    };
    match refused {
        true => AmqpError::Refused(text),
        false => AmqpError::Unreachable(text),
    }
}

/// The frames of `stream` (whole frames, as the broker sends them) as the client reads them
/// through the frame guard (module `wire`), with the broker's `frame_max` of 128 KiB.
pub fn guard_frames(stream: &[u8]) -> Vec<u8> {
    wire::guard_all(stream, 131_072)
}

/// How long a connection may take to open (TCP, TLS and AMQP's handshake) unless the URL says
/// otherwise (`?connection_timeout=MS`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a connection to `url`, every frame of the broker's guarded (module `wire`).
async fn connect(url: &AmqpUrl) -> Result<Connection, AmqpError> {
    let uri: lapin::uri::AMQPUri = url
        .expose()
        .parse()
        .map_err(|e: String| AmqpError::Settings(url.scrub(&format!("the URL: {e}"))))?;
    let within = uri
        .query
        .connection_timeout
        .map_or(CONNECT_TIMEOUT, Duration::from_millis);
    let properties = ConnectionProperties::default()
        .with_connection_name(LongString::from("batch-inbox".as_bytes().to_vec()));
    match tokio::time::timeout(within, wire::connect(uri, properties)).await {
        Ok(connected) => connected.map_err(|e| classify(url, e)),
        Err(_) => Err(AmqpError::Unreachable(format!(
            "no connection within {} ms",
            within.as_millis()
        ))),
    }
}

/// Declares `queue` durable, single active consumer, of type `kind`: creates it when it is
/// missing, and is refused (406) when it exists with other arguments.
pub async fn declare(
    channel: &Channel,
    queue: &str,
    kind: QueueType,
) -> lapin::Result<lapin::Queue> {
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-single-active-consumer"),
        AMQPValue::Boolean(true),
    );
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from(kind.to_string().into_bytes())),
    );
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(ShortString::from(queue), options, args)
        .await
}

/// A channel's run shorter than this counts as a failure for the backoff.
const SHORT_RUN: Duration = Duration::from_secs(1);

/// The delay before the `failures`-th retry: 100 ms doubling, at most 5 s.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100u64 << failures.min(6)).min(Duration::from_secs(5))
}

/// The one connection the queues' channels share, opened again when it is gone.
struct Connector {
    url: AmqpUrl,
    current: tokio::sync::Mutex<Option<Arc<Connection>>>,
}

impl Connector {
    /// A new channel on the current connection (connected anew when it is gone).
    async fn channel(&self) -> Result<Channel, AmqpError> {
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_ref() {
            if c.status().connected() {
                match c.create_channel().await {
                    Ok(channel) => return Ok(channel),
                    Err(e) => tracing::info!(
                        "cannot open a channel, connecting again: {}",
                        self.url.scrub(&e.to_string())
                    ),
                }
            }
        }
        let connection = Arc::new(connect(&self.url).await?);
        *current = Some(connection.clone());
        connection
            .create_channel()
            .await
            .map_err(|e| classify(&self.url, e))
    }

    async fn close(&self) {
        if let Some(c) = self.current.lock().await.take() {
            let _ = c.close(200, ShortString::from("shutting down")).await;
        }
    }
}

/// What the source knows of one queue, for `--exit-on-eof`.
#[derive(Default)]
struct QueueState {
    /// A channel's run is under way (from its first delivery to its end).
    busy: AtomicBool,
    /// The run's end flag (every record read committed, the source idle), while it runs.
    at_eof: Mutex<Option<Arc<AtomicBool>>>,
    /// Deliveries received.
    delivered: AtomicU64,
    /// What the queue acknowledged.
    acked: Arc<Acknowledged>,
}

/// RabbitMQ queues as a [`Source`]. Its settings were checked ([`AmqpSettings::check`]).
pub(crate) struct AmqpSource {
    /// The broker and the queues.
    pub settings: AmqpSettings,
    /// Return once every queue is empty and every delivery acknowledged.
    pub exit_on_eof: bool,
    /// The database the positions are read from.
    pub pool: Pool,
    /// What the run counts.
    pub stats: Arc<Stats>,
}

/// How long a queue's deliveries stay idle before the run is told it reached the end (with
/// `--exit-on-eof` only).
const IDLE_EOF: Duration = Duration::from_millis(100);

/// How often `--exit-on-eof` looks whether every queue is drained.
const DRAIN_POLL: Duration = Duration::from_millis(250);

impl Source for AmqpSource {
    async fn run(
        self,
        partitions: Arc<dyn Partitions>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let Self {
            settings,
            exit_on_eof,
            pool,
            stats,
        } = self;
        let connector = Arc::new(Connector {
            url: settings.url.clone(),
            current: tokio::sync::Mutex::new(None),
        });
        let stop = CancellationToken::new();
        let (fail_tx, mut fail_rx) = mpsc::unbounded_channel::<RunError>();
        let mut states = HashMap::new();
        let mut tasks = Vec::new();
        for q in &settings.queues {
            let state = Arc::new(QueueState::default());
            states.insert(q.clone(), state.clone());
            let queue = Reader {
                queue: Arc::from(q.as_str()),
                settings: settings.clone(),
                connector: connector.clone(),
                pool: pool.clone(),
                stats: stats.clone(),
                partitions: partitions.clone(),
                state,
                exit_on_eof,
                stop: stop.clone(),
            };
            let failures = fail_tx.clone();
            tasks.push(tokio::spawn(async move {
                if let Err(e) = queue.run().await {
                    let _ = failures.send(e);
                }
            }));
        }
        drop(fail_tx);
        let drained = async {
            match exit_on_eof {
                true => drained(&connector, &settings, &states).await,
                false => std::future::pending().await,
            }
        };
        let result = tokio::select! {
            _ = shutdown => Ok(()),
            Some(e) = fail_rx.recv() => Err(e),
            () = drained => Ok(()),
        };
        stop.cancel();
        for t in tasks {
            let _ = t.await;
        }
        connector.close().await;
        // A failure while stopping is still the run's.
        match (result, fail_rx.try_recv()) {
            (Ok(()), Ok(e)) => Err(e),
            (r, _) => r,
        }
    }
}

/// Returns once every queue is drained: no run reading it (or its run at its end with every
/// record committed), every ack sent, no message ready in the broker, and no delivery since the
/// last look.
async fn drained(
    connector: &Connector,
    settings: &AmqpSettings,
    states: &HashMap<String, Arc<QueueState>>,
) {
    let mut last_seen: Option<u64> = None;
    loop {
        tokio::time::sleep(DRAIN_POLL).await;
        let delivered: u64 = states
            .values()
            .map(|s| s.delivered.load(Ordering::Acquire))
            .sum();
        let idle = states.values().all(|s| {
            let at_eof = s
                .at_eof
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
                .is_some_and(|e| e.load(Ordering::Acquire));
            (!s.busy.load(Ordering::Acquire) || at_eof) && s.acked.settled()
        });
        if !idle {
            last_seen = None;
            continue;
        }
        let empty = match ready_messages(connector, settings).await {
            Ok(n) => n == 0,
            Err(e) => {
                tracing::debug!("cannot count the queues' messages: {e}");
                false
            }
        };
        if empty && last_seen == Some(delivered) {
            return;
        }
        last_seen = empty.then_some(delivered);
    }
}

/// The messages ready in every queue (a passive declaration of each, on a channel of its own).
async fn ready_messages(connector: &Connector, settings: &AmqpSettings) -> Result<u64, AmqpError> {
    let channel = connector.channel().await?;
    let mut ready = 0u64;
    for q in &settings.queues {
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let queue = channel
            .queue_declare(
                ShortString::from(q.as_str()),
                options,
                FieldTable::default(),
            )
            .await
            .map_err(|e| classify(&settings.url, e))?;
        ready += u64::from(queue.message_count());
    }
    let _ = channel.close(200, ShortString::from("counted")).await;
    Ok(ready)
}

/// One queue's reader: a channel after another, each a run of the queue.
struct Reader {
    queue: Arc<str>,
    settings: AmqpSettings,
    connector: Arc<Connector>,
    pool: Pool,
    stats: Arc<Stats>,
    partitions: Arc<dyn Partitions>,
    state: Arc<QueueState>,
    exit_on_eof: bool,
    stop: CancellationToken,
}

impl Reader {
    /// Opens a channel after another until stopped; a refusal or a run's error ends it.
    async fn run(self) -> Result<(), RunError> {
        let mut failures = 0u32;
        let mut opened = false;
        while !self.stop.is_cancelled() {
            let open = tokio::select! {
                _ = self.stop.cancelled() => break,
                open = self.open() => open,
            };
            match open {
                Ok((channel, consumer)) => {
                    opened = true;
                    let began = std::time::Instant::now();
                    let result = self.read(&channel, consumer).await;
                    if channel.status().connected() {
                        let _ = channel.close(200, ShortString::from("run ended")).await;
                    }
                    result?;
                    // A channel that ends at once, again and again, is retried with the same
                    // backoff as a failed open, not in a tight loop.
                    match began.elapsed() < SHORT_RUN {
                        true => {
                            failures += 1;
                            tokio::select! {
                                _ = self.stop.cancelled() => break,
                                _ = tokio::time::sleep(backoff(failures)) => {}
                            }
                        }
                        false => failures = 0,
                    }
                }
                Err(AmqpError::NotFound(e)) if opened => {
                    failures += 1;
                    tracing::warn!(
                        queue = %self.queue,
                        "the queue is not available (a clustered queue's node down?), will \
                         retry: {e}"
                    );
                    tokio::select! {
                        _ = self.stop.cancelled() => break,
                        _ = tokio::time::sleep(backoff(failures)) => {}
                    }
                }
                Err(e) if e.is_refusal() => {
                    return Err(RunError::Amqp(AmqpError::Refused(format!(
                        "queue {}: {e}",
                        self.queue
                    ))))
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(queue = %self.queue, "cannot read the queue, will retry: {e}");
                    tokio::select! {
                        _ = self.stop.cancelled() => break,
                        _ = tokio::time::sleep(backoff(failures)) => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// A channel of the queue's own, with its prefetch, the queue declared and one consumer.
    async fn open(&self) -> Result<(Channel, Consumer), AmqpError> {
        let channel = self.connector.channel().await?;
        let error = |e| classify(&self.settings.url, e);
        channel
            .basic_qos(self.settings.prefetch, BasicQosOptions::default())
            .await
            .map_err(error)?;
        declare(&channel, &self.queue, self.settings.queue_type)
            .await
            .map_err(error)?;
        let consumer = channel
            .basic_consume(
                ShortString::from(&*self.queue),
                ShortString::from(""),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(error)?;
        Ok((channel, consumer))
    }

    /// One channel's run: from its first delivery (a standby of a single active consumer waits
    /// here), numbered from the database's position, until the channel closes, a rewind ends
    /// it, or the source stops.
    async fn read(&self, channel: &Channel, mut consumer: Consumer) -> Result<(), RunError> {
        // The queue counts as assigned (`/readyz`, the assigned-partitions gauge) while its
        // consumer waits, a standby's included; once its run starts, the run counts it.
        let waiting = self.stats.telemetry.partition_assigned();
        let first = tokio::select! {
            _ = self.stop.cancelled() => return Ok(()),
            d = consumer.next() => d,
        };
        let first = match first {
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                tracing::info!(queue = %self.queue, "channel closed: {}", self.settings.url.scrub(&e.to_string()));
                return Ok(());
            }
            None => return Ok(()),
        };
        self.state.busy.store(true, Ordering::Release);
        let _idle = BusyGuard(&self.state);
        let Some(start) = self.start_position().await else {
            return Ok(()); // stopping
        };
        // A database that went back below what this process acknowledged while no channel was
        // open (between two runs) lost records the queue no longer holds: stop, as a rewind does.
        if let Some(through) = self.state.acked.through() {
            if start < through {
                return Err(RunError::Amqp(AmqpError::Refused(acks::lost_below(
                    &self.queue,
                    start,
                    through,
                ))));
            }
        }
        let base = start;
        let (acks, ack_task) = ChannelAcks::new(
            self.queue.clone(),
            self.state.acked.clone(),
            self.stats.clone(),
        );
        let sink: Arc<dyn OffsetSink> = acks.clone();
        let run: PartitionRun = self
            .partitions
            .start(self.queue.clone(), 0, Some(start), sink);
        drop(waiting);
        *self.lock_eof() = Some(run.at_eof.clone());
        let run_stop = run.stop.clone();
        let ended = CancellationToken::new();
        let forward = {
            let (stop, ended) = (self.stop.clone(), ended.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => run_stop.cancel(),
                    _ = ended.cancelled() => {}
                }
            })
        };
        let feed = Feed {
            queue: self.queue.clone(),
            base,
            acks: acks.clone(),
            state: self.state.clone(),
            url: self.settings.url.clone(),
            eof: self.exit_on_eof,
            stats: self.stats.clone(),
        };
        // A clone of the consumer keeps it registered until the channel closes: dropping the
        // last one cancels it (`basic.cancel`), and a single-active-consumer queue would then
        // make a standby active while this channel still holds unacknowledged deliveries, which
        // go back to the queue only when it closes, behind what the standby already took.
        let keep = consumer.clone();
        let input = feed.stream(first, consumer);
        let result = run.run.run(input.boxed()).await;
        ended.cancel();
        let _ = forward.await;
        *self.lock_eof() = None;
        drop(acks);
        // The acks of what committed go out before the channel closes (each bounded), and the
        // consumer is cancelled only with the channel.
        let _ = ack_task.await;
        if channel.status().connected() {
            let _ = channel.close(200, ShortString::from("run ended")).await;
        }
        drop(keep);
        result
    }

    /// The database's position of the queue (created at 0 on its first run), read again while
    /// the database fails; `None`: stopping.
    async fn start_position(&self) -> Option<i64> {
        positions::claim_until_stopped(&self.pool, &self.settings.reader, &self.queue, &self.stop)
            .await
    }

    fn lock_eof(&self) -> std::sync::MutexGuard<'_, Option<Arc<AtomicBool>>> {
        self.state
            .at_eof
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Clears a queue's `busy` when its run ends.
struct BusyGuard<'a>(&'a QueueState);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// The deliveries of one channel as the run's input.
struct Feed {
    queue: Arc<str>,
    base: i64,
    acks: Arc<ChannelAcks>,
    state: Arc<QueueState>,
    url: AmqpUrl,
    eof: bool,
    stats: Arc<Stats>,
}

impl Feed {
    /// `first`, then the consumer's deliveries, each numbered and its acker held; ends when the
    /// channel closes or a rewind ended it. With `eof`, an [`Input::Eof`] after [`IDLE_EOF`]
    /// without a delivery.
    fn stream(
        self,
        first: lapin::message::Delivery,
        consumer: Consumer,
    ) -> impl Stream<Item = Input> + Send {
        let first = self.record(first);
        let rest = futures::stream::unfold(
            (self, consumer, false),
            |(feed, mut consumer, told_eof)| async move {
                let ended = feed.acks.ended.clone();
                let next = tokio::select! {
                    biased;
                    _ = ended.cancelled() => return None,
                    next = async {
                        match feed.eof && !told_eof {
                            true => tokio::time::timeout(IDLE_EOF, consumer.next()).await.ok(),
                            false => Some(consumer.next().await),
                        }
                    } => next,
                };
                match next {
                    None => Some((Input::Eof, (feed, consumer, true))),
                    Some(Some(Ok(d))) => {
                        let input = feed.record(d);
                        Some((input, (feed, consumer, false)))
                    }
                    Some(Some(Err(e))) => {
                        tracing::info!(
                            queue = %feed.queue,
                            "channel closed: {}; its run ends, and a new channel reads on",
                            feed.url.scrub(&e.to_string())
                        );
                        None
                    }
                    Some(None) => None,
                }
            },
        );
        futures::stream::once(async move { first }).chain(rest)
    }

    fn record(&self, d: lapin::message::Delivery) -> Input {
        self.state.delivered.fetch_add(1, Ordering::AcqRel);
        if d.redelivered {
            self.stats.telemetry.record_redelivery();
        }
        let tag = i64::try_from(d.delivery_tag).unwrap_or(i64::MAX);
        let position = self.base.saturating_add(tag - 1);
        self.acks.hold(position, d.acker);
        Input::Record(delivery::to_raw(
            &self.queue,
            position,
            &d.properties,
            d.data,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_amqp_cannot_carry_or_rabbitmq_reserves_are_refused() {
        assert!(check_queue_name("orders").is_ok());
        assert!(check_queue_name("é/with spaces").is_ok());
        assert!(check_queue_name("").is_err());
        assert!(check_queue_name(&"q".repeat(256)).is_err());
        assert!(check_queue_name(&"q".repeat(255)).is_ok());
        assert!(check_queue_name("a\0b").is_err());
        assert!(check_queue_name("amq.gen-1").is_err());
    }

    #[test]
    fn the_url_s_password_is_never_shown() {
        let url = AmqpUrl::new("amqp://app:Sup3rS3cretPw@broker:5672/%2f");
        assert_eq!(
            format!("{url:?}"),
            "AmqpUrl(\"amqp://app:***@broker:5672/%2f\")"
        );
        assert_eq!(
            url.scrub("connection to amqp://app:Sup3rS3cretPw@broker failed"),
            "connection to amqp://app:***@broker failed"
        );
        assert!(AmqpUrl::is_amqp("amqps://h"));
        assert!(AmqpUrl::is_amqp("AMQP://h"));
        assert!(!AmqpUrl::is_amqp("kafka://h"));
    }

    #[test]
    fn prefetch_is_two_batches_within_amqp_s_limit() {
        assert_eq!(AmqpSettings::prefetch_for(1000), 2000);
        assert_eq!(AmqpSettings::prefetch_for(1), 2);
        assert_eq!(AmqpSettings::prefetch_for(100_000), u16::MAX);
    }

    #[test]
    fn settings_without_queues_or_positions_in_the_database_are_refused() {
        let url = AmqpUrl::new("amqp://h");
        let mut s = AmqpSettings::new(url, vec![], "g");
        assert!(s.check(true).is_err());
        s.queues = vec!["q".to_owned()];
        assert!(s.check(true).is_ok());
        assert!(s.check(false).is_err());
        s.prefetch = 0;
        assert!(s.check(true).is_err());
    }
}

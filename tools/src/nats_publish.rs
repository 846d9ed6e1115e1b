//! `nats-publish`: the generated ledger records to a NATS JetStream stream, as a service that
//! publishes them would: the record id in the `Nats-Msg-Id` header (none for a record without an
//! id), the value as the payload (empty for a record without one), the send time in the
//! `timestamp_in_ms` header (decimal milliseconds), each publish acknowledged by the stream.
//! With several subjects, each account's records go to one subject (by account id), so that each
//! account's order holds as on a Kafka partition and the model's overdraft decisions stay right.
//!
//! The stream drops a publish whose `Nats-Msg-Id` it saw within its duplicate window (the
//! acknowledgement says `duplicate`): the generator's re-sent ids published close together, and
//! the bad records that share the id `not-a-uuid`, never reach a consumer. The expected outcome
//! is therefore the model of what the stream stored, not of what was generated.
//!
//! With `--streams N`, the accounts are spread over N streams `NAME-0` … `NAME-<N-1>` (each
//! account's records to one), as RabbitMQ's queues and Kafka's partitions spread them.
//!
//! `nats-stream-info`: a stream's message count and first and last sequence, as JSON.
//!
//! `nats-consume-only`: the server's own floor, the streams read and acknowledged by batches as
//! the processor reads them, nothing applied.

use std::future::IntoFuture;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;

use crate::generate::{Expected, Model, Record};

/// Most publishes awaiting their acknowledgement at once.
pub const IN_FLIGHT: usize = 5_000;

/// The longest wait for a publish's acknowledgement (async-nats' default is 5 s, short for 5,000
/// in flight on a loaded machine); past it the publish fails, its outcome unknown.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// The server and the stream of `nats-publish` and `nats-stream-info` (with `--streams`, the
/// streams' common name).
#[derive(Debug, Clone, clap::Args)]
pub struct StreamArgs {
    /// The server (`nats://user:password@host:port`); its password is never shown.
    #[arg(long, env = "NATS_URL", hide_env_values = true)]
    pub url: String,
    /// The JetStream stream.
    #[arg(long)]
    pub stream: String,
}

/// `nats-publish` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct NatsPublishArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub target: StreamArgs,
    /// Subjects are `PREFIX.0` to `PREFIX.<N-1>`; the stream's name when absent.
    #[arg(long)]
    pub subject_prefix: Option<String>,
    /// How many subjects the accounts spread over (an account's records all go to one).
    #[arg(long, default_value_t = std::num::NonZeroUsize::MIN)]
    pub subjects: std::num::NonZeroUsize,
    /// Spread the accounts over this many streams, `STREAM-0` to `STREAM-<N-1>` (subjects
    /// `PREFIX-<i>.…`), each account's records to one of them by account id, as RabbitMQ's
    /// queues and Kafka's partitions are; 1: the stream `STREAM` itself.
    #[arg(long, default_value_t = std::num::NonZeroUsize::MIN)]
    pub streams: std::num::NonZeroUsize,
    /// Create the stream when it does not exist: file storage, subjects `PREFIX.>`, limits
    /// retention, discard old, no maximum age. An existing stream is used as it is.
    #[arg(long)]
    pub create_stream: bool,
    /// The duplicate window of a stream `--create-stream` creates (`2m`, `30s`, `500ms`; at
    /// least 100ms): a publish whose `Nats-Msg-Id` the stream saw within it is dropped.
    #[arg(long, default_value = "2m", value_parser = parse_window)]
    pub duplicate_window: Duration,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub generator: crate::cli::GeneratorArgs,
    /// Write the expected outcome (counts, balances) of the records the stream stored as JSON
    /// to this file.
    #[arg(long)]
    pub expect: Option<std::path::PathBuf>,
    /// Publish at this many records per second (paced, each record stamped with its intended
    /// send time) instead of as fast as the stream acknowledges.
    #[arg(long)]
    pub rate: Option<f64>,
}

/// `nats-stream-info` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct NatsStreamInfoArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub target: StreamArgs,
}

/// A duplicate window: a whole number with `ms`, `s`, `m` or `h`, at least 100 ms (nats-server
/// refuses a shorter one, and takes 0 for its default, 2 minutes).
fn parse_window(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("expected a duration like 2m, 30s or 500ms, got {s:?}"))?;
    let window = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use ms, s, m or h")),
    };
    if window < Duration::from_millis(100) {
        return Err(format!(
            "{s:?} is under 100ms, the shortest window nats-server takes"
        ));
    }
    Ok(window)
}

/// Where each record goes: `streams` streams (`NAME` alone, or `NAME-0` to `NAME-<n-1>`), each
/// with subjects `PREFIX.0` to `PREFIX.<subjects-1>` (its own prefix, `PREFIX-<i>`, when there are
/// several streams). An account's records all go to one stream and one subject, by account id,
/// so that each account keeps its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// The streams' names.
    pub streams: Vec<String>,
    /// Each stream's subject prefix.
    pub prefixes: Vec<String>,
    /// Subjects per stream.
    pub subjects: usize,
}

impl Routing {
    /// `streams` streams named after `name` (just `name` for one), subjects after `prefix`
    /// (`name` when absent).
    pub fn new(name: &str, prefix: Option<&str>, streams: usize, subjects: usize) -> Self {
        let prefix = prefix.unwrap_or(name);
        let (streams, prefixes) = match streams.max(1) {
            1 => (vec![name.to_owned()], vec![prefix.to_owned()]),
            n => (0..n)
                .map(|i| (format!("{name}-{i}"), format!("{prefix}-{i}")))
                .unzip(),
        };
        Routing {
            streams,
            prefixes,
            subjects: subjects.max(1),
        }
    }

    fn account(record: &Record) -> u64 {
        record.key.parse().unwrap_or(0)
    }

    /// The number of a record's stream.
    pub fn stream_of(&self, record: &Record) -> usize {
        (Self::account(record) % self.streams.len() as u64) as usize
    }

    /// The number of a record's subject within its stream.
    pub fn subject_index_of(&self, record: &Record) -> usize {
        (Self::account(record) / self.streams.len() as u64 % self.subjects as u64) as usize
    }

    /// The subject of a record.
    pub fn subject_of(&self, record: &Record) -> String {
        format!(
            "{}.{}",
            self.prefixes[self.stream_of(record)],
            self.subject_index_of(record)
        )
    }

    /// Stream `i`'s subject filter, which takes every one of its subjects: `PREFIX.>`.
    pub fn filter(&self, i: usize) -> String {
        format!("{}.>", self.prefixes[i])
    }
}

/// Connects to the server of `url` and opens its JetStream API with acknowledgements awaited
/// up to [`ACK_TIMEOUT`] and [`IN_FLIGHT`] of them at once. async-nats 0.51 does not log in
/// with a user and password written in the URL (it sends none), so they are taken from it here.
/// An error never shows the URL.
pub async fn connect(url: &str) -> anyhow::Result<jetstream::Context> {
    let addr: async_nats::ServerAddr = url
        .parse()
        .map_err(|_| anyhow::anyhow!("connecting to NATS: the URL does not parse"))?;
    let mut options = async_nats::ConnectOptions::new().name("batch-inbox-bench");
    if let Some(user) = addr.username() {
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        options = options.user_and_password(decode(user), decode(addr.password().unwrap_or("")));
    }
    let client = options
        .connect(addr)
        .await
        .map_err(|e| anyhow::anyhow!("connecting to NATS: {e}"))?;
    Ok(jetstream::ContextBuilder::new()
        .timeout(ACK_TIMEOUT)
        .max_ack_inflight(IN_FLIGHT)
        .backpressure_on_inflight(true)
        .build(client))
}

/// The stream `name`, created when missing with file storage, the subject `filter`, limits
/// retention, discard old, no maximum age and `duplicate_window`; an existing stream is returned
/// as it is.
pub async fn create_stream(
    js: &jetstream::Context,
    name: &str,
    filter: &str,
    duplicate_window: Duration,
) -> anyhow::Result<stream::Stream> {
    let config = stream::Config {
        name: name.to_owned(),
        subjects: vec![filter.to_owned()],
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::Old,
        max_age: Duration::ZERO,
        duplicate_window,
        num_replicas: 1,
        ..Default::default()
    };
    js.get_or_create_stream(config)
        .await
        .with_context(|| format!("creating stream {name}"))
}

/// What [`publish`] did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Published {
    /// Publishes the stream acknowledged, the ones it dropped as duplicates included.
    pub acked: u64,
    /// Publishes the stream acknowledged as duplicates of a `Nats-Msg-Id` within its window, and
    /// did not store.
    pub duplicates: u64,
    /// Per record, whether the stream stored it (false: dropped as a duplicate).
    #[serde(skip)]
    pub stored: Vec<bool>,
    /// Records stored, per stream (in the order of the streams).
    pub per_stream: Vec<u64>,
}

impl Published {
    /// The model of the records the stream stored, in publish order.
    pub fn expected(&self, records: &[Record]) -> Expected {
        let mut model = Model::default();
        for (record, stored) in records.iter().zip(&self.stored) {
            if *stored {
                model.apply(record);
            }
        }
        model.expected().clone()
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// A record's headers: its id in `Nats-Msg-Id`, `sent_ms` in `timestamp_in_ms`.
fn headers_of(record: &Record, sent_ms: u128) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(id) = &record.id {
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
    }
    headers.insert("timestamp_in_ms", sent_ms.to_string().as_str());
    headers
}

/// Publishes `records` to the streams of `routing`, at most [`IN_FLIGHT`] awaiting their
/// acknowledgement, at `rate` records per second when given (each stamped with its intended
/// send time, `start + i / rate`, even when the publisher falls behind) and as fast as the
/// stream acknowledges otherwise. Fails on the first publish a stream refuses or does not
/// acknowledge within 30 s, and on an acknowledgement from another stream than the record's.
pub async fn publish(
    js: &jetstream::Context,
    routing: &Routing,
    records: &[Record],
    rate: Option<f64>,
) -> anyhow::Result<Published> {
    if let Some(rate) = rate {
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0,
            "the rate must be a number of records per second above 0"
        );
    }
    let mut out = Published {
        stored: vec![false; records.len()],
        per_stream: vec![0; routing.streams.len()],
        ..Published::default()
    };
    let mut pending = FuturesUnordered::new();
    let start = tokio::time::Instant::now();
    let start_ms = now_ms();
    for (i, record) in records.iter().enumerate() {
        let sent_ms = match rate {
            Some(rate) => {
                let offset = Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(start + offset).await;
                start_ms + offset.as_millis()
            }
            None => now_ms(),
        };
        let subject = routing.subject_of(record);
        let payload = Bytes::from(record.value.clone().unwrap_or_default());
        let ack = js
            .publish_with_headers(subject, headers_of(record, sent_ms), payload)
            .await
            .with_context(|| format!("publishing record {i}"))?;
        pending.push(ack.into_future().map(move |r| (i, r)));
        // Settle what is acknowledged; wait when too many are in flight.
        while let Some(Some((i, result))) = if pending.len() >= IN_FLIGHT {
            Some(pending.next().await)
        } else {
            pending.next().now_or_never()
        } {
            settle(&mut out, routing, records, i, result)?;
        }
    }
    while let Some((i, result)) = pending.next().await {
        settle(&mut out, routing, records, i, result)?;
    }
    Ok(out)
}

fn settle(
    out: &mut Published,
    routing: &Routing,
    records: &[Record],
    i: usize,
    result: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
) -> anyhow::Result<()> {
    let ack = result.with_context(|| {
        format!(
            "the stream did not acknowledge record {i} (on {})",
            routing.subject_of(&records[i])
        )
    })?;
    let s = routing.stream_of(&records[i]);
    let stream = &routing.streams[s];
    anyhow::ensure!(
        ack.stream == *stream,
        "record {i} was stored by stream {}, not {stream}: their subjects overlap",
        ack.stream
    );
    out.acked += 1;
    if ack.duplicate {
        out.duplicates += 1;
    } else {
        out.stored[i] = true;
        out.per_stream[s] += 1;
    }
    Ok(())
}

/// Runs `nats-publish`.
pub async fn run(args: NatsPublishArgs) -> anyhow::Result<()> {
    let (records, _) = crate::generate::generate(args.generator.settings());
    let routing = Routing::new(
        &args.target.stream,
        args.subject_prefix.as_deref(),
        args.streams.get(),
        args.subjects.get(),
    );
    let js = connect(&args.target.url).await?;
    let mut windows = Vec::new();
    for (i, name) in routing.streams.iter().enumerate() {
        let stream = if args.create_stream {
            create_stream(&js, name, &routing.filter(i), args.duplicate_window).await?
        } else {
            js.get_stream(name)
                .await
                .with_context(|| format!("stream {name} (--create-stream creates it)"))?
        };
        windows.push(stream.cached_info().config.duplicate_window.as_secs_f64());
    }
    windows.dedup();
    let window = match windows.as_slice() {
        [one] => format!("{one}s"),
        several => format!("{several:?}s"),
    };
    let started = std::time::Instant::now();
    let out = publish(&js, &routing, &records, args.rate).await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "published {} records in {secs:.1}s ({:.0}/s): {} stored, {} dropped by the stream as \
         duplicates (Nats-Msg-Id within its {window} window)",
        out.acked,
        out.acked as f64 / secs,
        out.acked - out.duplicates,
        out.duplicates,
    );
    if routing.streams.len() > 1 {
        let per: Vec<String> = routing
            .streams
            .iter()
            .zip(&out.per_stream)
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        println!("stored per stream: {}", per.join(", "));
    }
    if let Some(path) = args.expect {
        let expected = out.expected(&records);
        std::fs::write(&path, serde_json::to_vec_pretty(&expected)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `nats-consume-only` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct NatsConsumeOnlyArgs {
    /// The server (`nats://user:password@host:port`); its password is never shown.
    #[arg(long, env = "NATS_URL", hide_env_values = true)]
    pub url: String,
    /// The streams to read, each by a task of its own (repeat the flag).
    #[arg(long = "stream", required = true)]
    pub streams: Vec<String>,
    /// The durable pull consumer on each stream; created when missing.
    #[arg(long, default_value = "consume-only")]
    pub consumer: String,
    /// Messages to read in all; the run ends when they are read and acknowledged (each stream's
    /// last pull may take up to a batch more). Default: every message the streams hold at the
    /// start.
    #[arg(long)]
    pub messages: Option<u64>,
    /// Messages pulled at once, and acknowledged with one `+ACK` to the last of them
    /// (`AckPolicy::All`), as the processor's batches are.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: usize,
    /// Write `{"records", "window_s", "msgs_per_sec"}` (first delivery to the last ack) here.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// The server's own floor: each stream read by a durable pull consumer configured as the
/// processor's (ack policy all, two batches unacknowledged at most), by pulls of a batch, the
/// last message of each acknowledged (nothing awaited: no double ack), nothing applied. Ends
/// once `messages` are read and their acknowledgements flushed to the server.
pub async fn consume_only(args: NatsConsumeOnlyArgs) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, OnceLock};
    anyhow::ensure!(args.batch_size > 0, "--batch-size must be above 0");
    let js = connect(&args.url).await?;
    let mut consumers = Vec::new();
    let mut held = 0u64;
    for name in &args.streams {
        let mut stream = js
            .get_stream(name)
            .await
            .with_context(|| format!("stream {name}"))?;
        held += stream.info().await?.state.messages;
        let config = jetstream::consumer::pull::Config {
            durable_name: Some(args.consumer.clone()),
            ack_policy: jetstream::consumer::AckPolicy::All,
            ack_wait: Duration::from_secs(30),
            max_ack_pending: i64::try_from(args.batch_size.saturating_mul(2)).unwrap_or(i64::MAX),
            ..Default::default()
        };
        let consumer = stream
            .get_or_create_consumer(&args.consumer, config)
            .await
            .with_context(|| format!("consumer {} on stream {name}", args.consumer))?;
        consumers.push((name.clone(), consumer));
    }
    let total = args.messages.unwrap_or(held);
    let read = Arc::new(AtomicU64::new(0));
    let first = Arc::new(OnceLock::<std::time::Instant>::new());
    let mut tasks = Vec::new();
    for (name, consumer) in consumers {
        let (read, first, batch) = (read.clone(), first.clone(), args.batch_size);
        tasks.push(tokio::spawn(async move {
            while read.load(Ordering::Acquire) < total {
                // No wait: the server answers with what it has, up to a batch.
                let mut messages = consumer
                    .fetch()
                    .max_messages(batch)
                    .messages()
                    .await
                    .with_context(|| format!("pulling from {name}"))?;
                let mut last = None;
                let mut n = 0u64;
                while let Some(message) = messages.next().await {
                    let message =
                        message.map_err(|e| anyhow::anyhow!("reading from {name}: {e}"))?;
                    first.get_or_init(std::time::Instant::now);
                    last = Some(message);
                    n += 1;
                }
                match last {
                    Some(m) => {
                        m.ack()
                            .await
                            .map_err(|e| anyhow::anyhow!("acknowledging on {name}: {e}"))?;
                        read.fetch_add(n, Ordering::AcqRel);
                    }
                    // This stream is read to its end; the others may not be.
                    None => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    // The acknowledgements are publishes: the run ends once the server has them.
    js.client()
        .flush()
        .await
        .map_err(|e| anyhow::anyhow!("flushing the acknowledgements: {e}"))?;
    let window = first.get().map_or(0.0, |f| f.elapsed().as_secs_f64());
    let records = read.load(Ordering::Acquire);
    let report = serde_json::json!({
        "records": records,
        "window_s": window,
        "msgs_per_sec": records as f64 / window.max(1e-9),
    });
    println!("{report}");
    if let Some(path) = args.out {
        std::fs::write(&path, report.to_string())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// What `nats-stream-info` prints.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamState {
    /// The stream's name.
    pub stream: String,
    /// Messages stored.
    pub messages: u64,
    /// Bytes stored.
    pub bytes: u64,
    /// Sequence of the first message stored (0 when none ever was).
    pub first_seq: u64,
    /// Sequence of the last message stored.
    pub last_seq: u64,
    /// Consumers of the stream.
    pub consumers: usize,
}

/// The state of stream `name`.
pub async fn stream_state(js: &jetstream::Context, name: &str) -> anyhow::Result<StreamState> {
    let mut stream = js
        .get_stream(name)
        .await
        .with_context(|| format!("stream {name}"))?;
    let state = &stream.info().await?.state;
    Ok(StreamState {
        stream: name.to_owned(),
        messages: state.messages,
        bytes: state.bytes,
        first_seq: state.first_sequence,
        last_seq: state.last_sequence,
        consumers: state.consumer_count,
    })
}

/// Runs `nats-stream-info`: one line of JSON.
pub async fn stream_info(args: NatsStreamInfoArgs) -> anyhow::Result<()> {
    let js = connect(&args.target.url).await?;
    let state = stream_state(&js, &args.target.stream).await?;
    println!("{}", serde_json::to_string(&state)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, id: Option<&str>) -> Record {
        Record {
            key: key.to_owned(),
            value: None,
            id: id.map(str::to_owned),
        }
    }

    #[test]
    fn an_accounts_records_share_one_subject() {
        let s = Routing::new("ledger", None, 1, 4);
        assert_eq!(s.streams, ["ledger"]);
        assert_eq!(s.subject_of(&record("7", None)), "ledger.3");
        assert_eq!(s.subject_of(&record("8", None)), "ledger.0");
        assert_eq!(s.filter(0), "ledger.>");
        let one = Routing::new("ledger", None, 1, 1);
        assert_eq!(one.subject_of(&record("7", None)), "ledger.0");
    }

    #[test]
    fn an_accounts_records_share_one_stream_of_several() {
        let s = Routing::new("ledger", Some("l"), 4, 2);
        assert_eq!(s.streams, ["ledger-0", "ledger-1", "ledger-2", "ledger-3"]);
        assert_eq!(s.filter(2), "l-2.>");
        // Account 7: stream 7 % 4 = 3, subject 7 / 4 % 2 = 1.
        assert_eq!(s.stream_of(&record("7", None)), 3);
        assert_eq!(s.subject_of(&record("7", None)), "l-3.1");
        assert_eq!(s.subject_of(&record("11", None)), "l-3.0");
        assert_eq!(s.subject_of(&record("8", None)), "l-0.0");
    }

    #[test]
    fn the_id_goes_in_nats_msg_id_and_none_without_one() {
        let with = headers_of(&record("1", Some("0190-id")), 1_700_000_000_123);
        assert_eq!(with.get("Nats-Msg-Id").map(|v| v.as_str()), Some("0190-id"));
        assert_eq!(
            with.get("timestamp_in_ms").map(|v| v.as_str()),
            Some("1700000000123")
        );
        let without = headers_of(&record("1", None), 5);
        assert!(without.get("Nats-Msg-Id").is_none());
    }

    #[test]
    fn duplicate_windows_parse_and_what_the_server_refuses_is_refused() {
        assert_eq!(parse_window("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_window("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_window("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_window("0s").is_err());
        assert!(parse_window("99ms").unwrap_err().contains("100ms"));
        assert_eq!(parse_window("100ms"), Ok(Duration::from_millis(100)));
        assert!(parse_window("2").is_err());
        assert!(parse_window("2 min").is_err());
    }

    #[test]
    fn the_model_skips_what_the_stream_dropped() {
        let entry =
            |amount: i64| Some(format!(r#"{{"account_id":1,"amount":{amount}}}"#).into_bytes());
        let id = "0190a0a0-0000-7000-8000-000000000001";
        let records = vec![
            Record {
                key: "1".to_owned(),
                value: entry(5),
                id: Some(id.to_owned()),
            },
            Record {
                key: "1".to_owned(),
                value: entry(5),
                id: Some(id.to_owned()),
            },
        ];
        let published = Published {
            stored: vec![true, false],
            ..Published::default()
        };
        let e = published.expected(&records);
        assert_eq!((e.records, e.new, e.duplicates), (1, 1, 0));
    }
}

//! NATS JetStream in a chaos run: the streams the processors read (one per account modulo their
//! number, each read through the same durable pull consumer by one processor at a time, the one
//! that holds the stream's advisory lock in PostgreSQL), the paced publisher that publishes
//! again what a server kill left unacknowledged, the streams read back at the end, the consumers'
//! state as JetStream reports it, and who holds which stream's lock (for the nemesis, and to
//! count takeovers).
//!
//! The expected outcome is the model of what the streams hold, in sequence order: the stream
//! drops a publish whose `Nats-Msg-Id` it saw within its duplicate window and stores any other,
//! a copy published again after a server kill too, and a record without an id each time it is
//! stored. Each stream sequence is applied once (its position is one number, moved by each
//! batch's transaction with a compare-and-set), so this model is exact, dead letters included.
//!
//! Invariants checked here: the streams hold every valid id of the input, and their model's
//! balances equal the input's (nothing lost by the publisher or the server, each account's order
//! kept); each stream's position in the database never moves backwards, ends at its last
//! sequence + 1 and covers every record the processors committed; every consumer ends with
//! nothing pending and nothing unacknowledged.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, consumer::DeliverPolicy};
use futures::StreamExt;
use serde::Serialize;
use uuid::Uuid;

use super::checker::Invariant;
use super::offsets::Samples;
use super::report::Rewind;
use crate::generate::{Expected, Model, Record};
use crate::nats_publish::{self, Routing};

/// How JetStream is set up for the run.
#[derive(Debug, Clone)]
pub struct Streams {
    /// The server's URL (it holds a password: never shown).
    pub url: String,
    /// The streams (`NAME-0` to `NAME-<n-1>`, or `NAME` for one), each account's records in
    /// one of them by account id, each stream's subjects its own.
    pub routing: Routing,
    /// The durable pull consumer of every stream (the processors' `--consumer`), the name the
    /// positions are kept under.
    pub consumer: String,
    /// The consumers' `ack_wait` (the processors' `--ack-wait`).
    pub ack_wait: Duration,
    /// The streams' duplicate window.
    pub duplicate_window: Duration,
}

impl Streams {
    /// The streams' names.
    pub fn names(&self) -> &[String] {
        &self.routing.streams
    }

    /// Records of the input per stream.
    pub fn per_stream(&self, records: &[Record]) -> Vec<u64> {
        let mut counts = vec![0; self.names().len()];
        for r in records {
            counts[self.routing.stream_of(r)] += 1;
        }
        counts
    }
}

/// The server's JetStream API, connected (an error never shows the URL).
pub async fn connect(s: &Streams) -> Result<jetstream::Context, String> {
    nats_publish::connect(&s.url)
        .await
        .map_err(|e| scrub(s, &format!("{e:#}")))
}

fn scrub(s: &Streams, text: &str) -> String {
    batch_inbox::NatsUrl::new(s.url.clone()).scrub(text)
}

/// Creates the streams: file storage, limits retention, no limits, the run's duplicate window.
pub async fn create(s: &Streams) -> Result<(), String> {
    let js = connect(s).await?;
    for (i, name) in s.names().iter().enumerate() {
        nats_publish::create_stream(&js, name, &s.routing.filter(i), s.duplicate_window)
            .await
            .map_err(|e| scrub(s, &format!("{e:#}")))?;
    }
    Ok(())
}

/// Records published per attempt: a failed attempt (the server killed, an acknowledgement
/// missing) is published again whole.
const CHUNK: usize = 500;

/// What the publisher did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamsPublished {
    /// Records of the input, per stream.
    pub per_stream: Vec<u64>,
    /// Publishes acknowledged in attempts that succeeded, stored or dropped as duplicates.
    pub acked: u64,
    /// Of those, dropped by a stream as a duplicate of a `Nats-Msg-Id` within its window.
    pub duplicates: u64,
    /// Attempts that failed (the connection lost, a publish refused or not acknowledged), each
    /// published again.
    pub failed_attempts: u64,
    /// Records published again by those attempts (a part of them was stored before the failure:
    /// the stream drops their copies within its window, the inbox skips the others).
    pub republished_records: u64,
}

/// Publishes the input to the streams, each account's records to its stream in order, at `rate`
/// records per second, each publish acknowledged; publishes an attempt of [`CHUNK`] records
/// again when it failed, until `give_up` passes without an attempt that succeeds.
pub async fn publish_paced(
    s: &Streams,
    records: &[Record],
    rate: f64,
    give_up: Duration,
) -> Result<StreamsPublished, String> {
    let js = connect(s).await?;
    let client = js.client();
    let mut out = StreamsPublished {
        per_stream: s.per_stream(records),
        ..StreamsPublished::default()
    };
    let mut last_success = Instant::now();
    for chunk in records.chunks(CHUNK) {
        loop {
            connected(&client, last_success + give_up)
                .await
                .map_err(|e| format!("{e} (no attempt succeeded for {give_up:?})"))?;
            let attempt = nats_publish::publish(&js, &s.routing, chunk, Some(rate));
            let failure = tokio::select! {
                r = attempt => match r {
                    Ok(p) => {
                        out.acked += p.acked;
                        out.duplicates += p.duplicates;
                        last_success = Instant::now();
                        break;
                    }
                    Err(e) => scrub(s, &format!("{e:#}")),
                },
                _ = lost(&client) => "the connection was lost".to_owned(),
            };
            out.failed_attempts += 1;
            out.republished_records += chunk.len() as u64;
            if last_success.elapsed() > give_up {
                return Err(format!("{failure} (no attempt succeeded for {give_up:?})"));
            }
            tracing::warn!("publishing again: {failure}");
            // The server may serve before JetStream answers (no responders): not in a loop.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(out)
}

fn is_connected(client: &async_nats::Client) -> bool {
    client.connection_state() == async_nats::connection::State::Connected
}

/// Resolves when the client is no longer connected.
async fn lost(client: &async_nats::Client) {
    while is_connected(client) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Resolves when the client is connected (it reconnects on its own), or fails at `deadline`.
async fn connected(client: &async_nats::Client, deadline: Instant) -> Result<(), String> {
    while !is_connected(client) {
        if Instant::now() >= deadline {
            return Err("not connected".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A stream's messages, read back in sequence order as records.
#[derive(Debug, Clone, Default)]
pub struct Contents {
    /// The records, in sequence order: the value is the payload, the id the `Nats-Msg-Id`
    /// header (the key is not kept).
    pub records: Vec<Record>,
    /// Sequences read, first and last.
    pub first_seq: u64,
    /// The last sequence read.
    pub last_seq: u64,
    /// Sequences missing between the first and the last.
    pub gaps: u64,
}

/// Reads stream `name` from its first message to `last_seq` through an ephemeral consumer that
/// acknowledges nothing (the durable consumer is not touched).
pub async fn read_back(
    js: &jetstream::Context,
    name: &str,
    last_seq: u64,
) -> Result<Contents, String> {
    let stream = js
        .get_stream(name)
        .await
        .map_err(|e| format!("stream {name}: {e}"))?;
    let reader = stream
        .create_consumer(pull::Config {
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("a reader of {name}: {e}"))?;
    let reader_name = reader.cached_info().name.clone();
    let mut out = Contents::default();
    let mut empty = 0;
    while out.last_seq < last_seq && empty < 3 {
        let mut batch = reader
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .map_err(|e| format!("reading {name}: {e}"))?;
        let mut got = 0;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| format!("reading {name}: {e}"))?;
            let seq = m
                .info()
                .map_err(|e| format!("reading {name}: {e}"))?
                .stream_sequence;
            if out.first_seq == 0 {
                out.first_seq = seq;
            } else {
                out.gaps += seq.saturating_sub(out.last_seq + 1);
            }
            out.last_seq = seq;
            let id = m
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|v| v.as_str().to_owned());
            out.records.push(Record {
                key: String::new(),
                value: Some(m.payload.to_vec()),
                id,
            });
            got += 1;
        }
        empty = if got == 0 { empty + 1 } else { 0 };
    }
    let _ = stream.delete_consumer(&reader_name).await;
    Ok(out)
}

/// The model of the streams' contents: each stream applied in sequence order (an account's
/// records are all in one stream, so the streams' relative order does not matter).
pub fn model_of(contents: &[Contents]) -> Expected {
    let mut model = Model::default();
    for c in contents {
        for r in &c.records {
            model.apply(r);
        }
    }
    model.expected().clone()
}

/// The streams hold every valid id of the input, without a gap, and their model's balances are
/// the input's (each account's records stored in the input's order).
pub fn streams_hold_input(
    contents: &[Contents],
    valid: &HashSet<Uuid>,
    of_streams: &Expected,
    of_input: &Expected,
) -> Invariant {
    let held: HashSet<Uuid> = contents
        .iter()
        .flat_map(|c| &c.records)
        .filter_map(|r| r.id.as_deref().and_then(|s| Uuid::try_parse(s.trim()).ok()))
        .collect();
    let absent = valid.difference(&held).count();
    let gaps: u64 = contents.iter().map(|c| c.gaps).sum();
    let messages: usize = contents.iter().map(|c| c.records.len()).sum();
    let differ: Vec<String> = of_input
        .balances
        .keys()
        .chain(of_streams.balances.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter_map(|a| {
            let (want, got) = (
                of_input.balances.get(a).copied().unwrap_or(0),
                of_streams.balances.get(a).copied().unwrap_or(0),
            );
            (want != got).then(|| format!("account {a}: {got}, input's model {want}"))
        })
        .collect();
    let ok = absent == 0 && gaps == 0 && differ.is_empty() && !contents.is_empty();
    let mut detail = format!(
        "{messages} messages in {} streams for {} records of the input ({} valid records whose \
         id came before: re-sent by the input past the duplicate window, or published again); \
         {absent} valid ids absent (lost by the publisher or the server); {gaps} sequences \
         missing",
        contents.len(),
        of_input.records,
        of_streams.duplicates,
    );
    if differ.is_empty() {
        detail.push_str("; the streams' model has the input's balances");
    } else {
        detail.push_str(&format!(
            "; {} balances of the streams' model differ from the input's (an account's records \
             stored out of order): {}",
            differ.len(),
            differ
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    Invariant {
        name: "streams_hold_input".to_owned(),
        ok,
        detail,
    }
}

/// One stream at the end of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamEnd {
    /// The stream.
    pub name: String,
    /// Records of the input published to it.
    pub input_records: u64,
    /// Messages it holds.
    pub messages: u64,
    /// Its first sequence.
    pub first_seq: u64,
    /// Its last sequence.
    pub last_seq: u64,
    /// The database's position (next sequence to apply).
    pub position: Option<i64>,
    /// The consumer's messages not yet delivered (`None`: its info could not be read).
    pub num_pending: Option<u64>,
    /// The consumer's deliveries not acknowledged.
    pub num_ack_pending: Option<u64>,
    /// The consumer's acknowledgement floor (stream sequence).
    pub ack_floor: Option<u64>,
    /// Deliveries beyond the first of each message over the consumer's life: its delivery
    /// sequence minus the last stream sequence delivered (the server's own count).
    pub redeliveries: Option<u64>,
}

/// Each stream's end: what it holds and what its consumer says, with the database's
/// `positions` (in the order of the names).
pub async fn ends(
    s: &Streams,
    js: &jetstream::Context,
    input: &[u64],
    positions: &[Option<i64>],
) -> Result<Vec<StreamEnd>, String> {
    let mut out = Vec::new();
    for (i, name) in s.names().iter().enumerate() {
        let state = nats_publish::stream_state(js, name)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let mut end = StreamEnd {
            name: name.clone(),
            input_records: input.get(i).copied().unwrap_or(0),
            messages: state.messages,
            first_seq: state.first_seq,
            last_seq: state.last_seq,
            position: positions.get(i).copied().flatten(),
            ..StreamEnd::default()
        };
        if let Some(info) = consumer_info(js, name, &s.consumer).await {
            end.num_pending = Some(info.num_pending);
            end.num_ack_pending = Some(info.num_ack_pending as u64);
            end.ack_floor = Some(info.ack_floor.stream_sequence);
            end.redeliveries = Some(
                info.delivered
                    .consumer_sequence
                    .saturating_sub(info.delivered.stream_sequence),
            );
        }
        out.push(end);
    }
    Ok(out)
}

/// The consumer's info (`$JS.API.CONSUMER.INFO.<stream>.<consumer>`), `None` when it cannot be
/// read.
pub async fn consumer_info(
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Option<jetstream::consumer::Info> {
    let stream = js.get_stream(stream).await.ok()?;
    stream.consumer_info(consumer).await.ok()
}

/// Whether every stream's position covers its last sequence and its consumer has nothing
/// pending or unacknowledged: the run has drained.
pub async fn drained(s: &Streams, js: &jetstream::Context, positions: &[Option<i64>]) -> bool {
    for (i, name) in s.names().iter().enumerate() {
        let Ok(state) = nats_publish::stream_state(js, name).await else {
            return false;
        };
        let at = positions.get(i).copied().flatten().unwrap_or(0);
        if at < state.last_seq as i64 + 1 {
            return false;
        }
        match consumer_info(js, name, &s.consumer).await {
            Some(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
            _ => return false,
        }
    }
    true
}

/// Every consumer read, with nothing pending and nothing unacknowledged.
pub fn consumers_drained(ends: &[StreamEnd]) -> Invariant {
    let not: Vec<String> = ends
        .iter()
        .filter(|e| e.num_pending != Some(0) || e.num_ack_pending != Some(0))
        .map(|e| match (e.num_pending, e.num_ack_pending) {
            (Some(p), Some(a)) => format!("{}: {p} pending, {a} unacknowledged", e.name),
            _ => format!("{}: the consumer's info could not be read", e.name),
        })
        .collect();
    let ok = !ends.is_empty() && not.is_empty();
    let detail = if ends.is_empty() {
        "no stream".to_owned()
    } else if ok {
        let floors: Vec<String> = ends
            .iter()
            .map(|e| format!("{} {}", e.name, e.ack_floor.unwrap_or(0)))
            .collect();
        format!(
            "{} consumers, 0 pending and 0 unacknowledged each; acknowledged up to {}",
            ends.len(),
            floors.join(", ")
        )
    } else {
        format!("not drained: {}", not.join("; "))
    };
    Invariant {
        name: "consumers_drained".to_owned(),
        ok,
        detail,
    }
}

/// The workers saw every stream's sequences without a gap (`gaps`: their "offset gap" WARN
/// lines). The streams hold none ([`Contents::gaps`]), so a gap is the source skipping records
/// it had not applied: loss, even where a copy published again hides it from the balances.
pub fn no_offset_gaps(contents: &[Contents], gaps: u64) -> Invariant {
    let in_streams: u64 = contents.iter().map(|c| c.gaps).sum();
    let ok = gaps == 0;
    let detail = if ok {
        "the processors saw no gap in any stream's sequences".to_owned()
    } else {
        format!(
            "{gaps} offset gaps logged by the processors (a record handed over after a higher \
             sequence than the one expected: the skipped ones were not applied in order, and are \
             acknowledged as committed when they come again); the streams hold {in_streams} gaps"
        )
    };
    Invariant {
        name: "no_offset_gaps".to_owned(),
        ok,
        detail,
    }
}

/// Each stream's position at its last sequence + 1 (every message applied, none beyond). The
/// records the processors committed (`committed`, summed over their reports) may exceed the
/// messages: a run that found the database's position below where it had read (a COMMIT whose
/// answer was lost, a delivery that came back below its position after a server restart lost
/// acknowledgements) reads again from there, and the inbox skips what the database holds; the
/// state invariants prove nothing was applied twice, this one reports the surplus.
pub fn positions_cover(ends: &[StreamEnd], committed: u64) -> Invariant {
    let off: Vec<String> = ends
        .iter()
        .filter(|e| e.position != Some(e.last_seq as i64 + 1))
        .map(|e| {
            format!(
                "{}: position {:?}, last sequence {}",
                e.name, e.position, e.last_seq
            )
        })
        .collect();
    let messages: u64 = ends.iter().map(|e| e.messages).sum();
    let ok = !ends.is_empty() && off.is_empty();
    let mut detail = format!(
        "{} streams, each position at its last sequence + 1 ({messages} messages); the \
         processors reported {committed} records committed",
        ends.len()
    );
    if !off.is_empty() {
        detail = format!(
            "positions not at the streams' ends (behind: records not applied; ahead: a position \
             past what the stream holds): {}",
            off.join("; ")
        );
    }
    if committed > messages {
        detail.push_str(&format!(
            "; {} committed again after reading again from the database's position (skipped \
             by the inbox)",
            committed - messages
        ));
    }
    Invariant {
        name: "positions_cover".to_owned(),
        ok,
        detail,
    }
}

/// The streams' positions in the database never moved backwards, but to a sequence a processor
/// announced it reads again (`rewinds`: stream and sequence of each "a delivery came back below
/// what this run reached ... reading again from it" line): the source then moves the position
/// back to that delivery on purpose, and the inbox skips what the database holds. A move back
/// that lands below every sequence announced for its stream is a violation. `names` are the
/// streams in the order of the samples' partitions.
pub fn positions_monotonic(samples: &Samples, names: &[String], rewinds: &[Rewind]) -> Invariant {
    let announced = |r: &super::offsets::Regression| {
        let stream = names.get(r.partition as usize);
        rewinds
            .iter()
            .any(|w| Some(&w.stream) == stream && w.sequence <= r.to)
    };
    let (explained, other): (Vec<_>, Vec<_>) =
        samples.regressions.iter().partition(|r| announced(r));
    let show = |r: &super::offsets::Regression| {
        format!(
            "{} from {} to {} at {:.1}s",
            names.get(r.partition as usize).map_or("?", String::as_str),
            r.from,
            r.to,
            r.at_s
        )
    };
    let ok = other.is_empty() && samples.samples > 0;
    let mut detail = match other.first() {
        None => format!(
            "{} samples, {} advances, no regression but to a sequence a processor read again",
            samples.samples, samples.advances
        ),
        Some(r) => format!(
            "{} positions moved back without a processor announcing it, in {} samples; first: {}",
            other.len(),
            samples.samples,
            show(r)
        ),
    };
    if !explained.is_empty() {
        let list: Vec<String> = explained.iter().map(|r| show(r)).collect();
        detail.push_str(&format!(
            "; back to a delivery a processor announced it reads again ({} announced): {}",
            rewinds.len(),
            list.join(", ")
        ));
    }
    Invariant {
        name: "offsets_monotonic".to_owned(),
        ok,
        detail,
    }
}

/// A stream's lock held by a processor: its session's backend and the member's slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The stream.
    pub stream: String,
    /// The member slot (from the session's `application_name`, `chaos-member-<slot>-<n>`).
    pub slot: Option<usize>,
    /// The session's `application_name`.
    pub session: String,
    /// The session's backend pid.
    pub pid: i32,
}

/// The `application_name` of member `slot`'s incarnation `incarnation`: its database sessions
/// carry it, so the lock holders can be told apart.
pub fn session_name(slot: usize, incarnation: u32) -> String {
    format!("chaos-member-{slot}-{incarnation}")
}

fn slot_of(session: &str) -> Option<usize> {
    let rest = session.strip_prefix("chaos-member-")?;
    rest.split('-').next()?.parse().ok()
}

/// Who holds each stream's lock, read from `pg_locks`: the product's key of a stream's lock is
/// the first 8 bytes of SHA-256 of `batch-inbox jetstream <stream> <consumer>`, big-endian.
const HOLDERS: &str = "
    SELECT k.stream, a.application_name, a.pid
      FROM unnest($1::text[]) AS k(stream)
      JOIN pg_locks l
        ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
       AND ((l.classid::bigint << 32) | l.objid::bigint)
           = ('x' || substr(encode(sha256(convert_to(
                 'batch-inbox jetstream ' || k.stream || ' ' || $2, 'UTF8')), 'hex'), 1, 16)
             )::bit(64)::bigint
      JOIN pg_stat_activity a ON a.pid = l.pid
     ORDER BY k.stream";

/// The database's view of the streams' locks.
#[derive(Debug, Clone)]
pub struct Locks {
    /// The run's database.
    pub database_url: String,
    /// The streams.
    pub streams: Vec<String>,
    /// Their consumer.
    pub consumer: String,
}

impl Locks {
    async fn client(&self) -> Result<tokio_postgres::Client, String> {
        let connect = tokio_postgres::connect(&self.database_url, tokio_postgres::NoTls);
        let (client, conn) = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .map_err(|_| "no answer within 2 s".to_owned())?
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(client)
    }

    /// The streams' lock holders now.
    pub async fn holders(&self) -> Result<Vec<Holder>, String> {
        let read = async {
            let client = self.client().await?;
            let rows = client
                .query(HOLDERS, &[&self.streams, &self.consumer])
                .await
                .map_err(|e| e.to_string())?;
            Ok(rows
                .iter()
                .map(|r| {
                    let session: Option<String> = r.get(1);
                    let session = session.unwrap_or_default();
                    Holder {
                        stream: r.get(0),
                        slot: slot_of(&session),
                        pid: r.get(2),
                        session,
                    }
                })
                .collect())
        };
        tokio::time::timeout(Duration::from_secs(3), read)
            .await
            .unwrap_or_else(|_| Err("no answer within 3 s".to_owned()))
    }

    /// Ends the sessions of backends `pids` (`pg_terminate_backend`), as a database that drops
    /// a silent client's connections would; returns how many it ended.
    pub async fn end_sessions(&self, pids: &[i32]) -> Result<u64, String> {
        let end = async {
            let client = self.client().await?;
            let row = client
                .query_one(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
                       FROM unnest($1::int[]) AS p(pid)",
                    &[&pids],
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok(row.get::<_, i64>(0) as u64)
        };
        tokio::time::timeout(Duration::from_secs(3), end)
            .await
            .unwrap_or_else(|_| Err("no answer within 3 s".to_owned()))
    }
}

/// What the sampler saw of the locks.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Takeovers {
    /// Samples in which the locks could be read.
    pub samples: u64,
    /// Times a stream's lock was seen held by another process than at its last sighting.
    pub takeovers: u64,
    /// Per stream, the processes (sessions) that held its lock, in order.
    pub holders: BTreeMap<String, Vec<String>>,
}

/// Samples the streams' positions and lock holders every `every` until `stop` is set; times are
/// seconds since `started`. A sample that fails (the database is down) is counted, not compared.
pub fn spawn_sampler(
    pool: deadpool_postgres::Pool,
    locks: Locks,
    every: Duration,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Samples, Takeovers)> {
    tokio::spawn(async move {
        let mut samples = Samples::default();
        let mut takeovers = Takeovers::default();
        let mut last: Vec<Option<i64>> = vec![None; locks.streams.len()];
        while !stop.load(Ordering::Acquire) {
            match super::queues::positions(&pool, &locks.consumer, &locks.streams).await {
                Ok(now) => {
                    samples.samples += 1;
                    super::offsets::record(
                        &mut samples,
                        &mut last,
                        &now,
                        started.elapsed().as_secs_f64(),
                    );
                }
                Err(_) => samples.failed_samples += 1,
            }
            if let Ok(holders) = locks.holders().await {
                takeovers.samples += 1;
                for h in holders {
                    let seen = takeovers.holders.entry(h.stream).or_default();
                    if seen.last() != Some(&h.session) {
                        if !seen.is_empty() {
                            takeovers.takeovers += 1;
                        }
                        seen.push(h.session);
                    }
                }
            }
            tokio::time::sleep(every).await;
        }
        (samples, takeovers)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(
        name: &str,
        last: u64,
        position: Option<i64>,
        consumer: Option<(u64, u64)>,
    ) -> StreamEnd {
        StreamEnd {
            name: name.to_owned(),
            messages: last,
            first_seq: 1,
            last_seq: last,
            position,
            num_pending: consumer.map(|c| c.0),
            num_ack_pending: consumer.map(|c| c.1),
            ..StreamEnd::default()
        }
    }

    fn record(account: u64, amount: i64, id: Option<&str>) -> Record {
        Record {
            key: account.to_string(),
            value: Some(format!(r#"{{"account_id":{account},"amount":{amount}}}"#).into_bytes()),
            id: id.map(str::to_owned),
        }
    }

    #[test]
    fn sessions_name_their_member() {
        assert_eq!(slot_of(&session_name(3, 7)), Some(3));
        assert_eq!(slot_of("batch-inbox"), None);
        assert_eq!(slot_of("chaos-member-x-1"), None);
    }

    #[test]
    fn an_account_goes_to_one_stream() {
        let s = Streams {
            url: String::new(),
            routing: Routing::new("run", None, 3, 1),
            consumer: "c".into(),
            ack_wait: Duration::from_secs(2),
            duplicate_window: Duration::from_secs(1),
        };
        assert_eq!(s.names(), ["run-0", "run-1", "run-2"]);
        let records = [record(4, 1, None), record(5, 1, None), record(7, 2, None)];
        assert_eq!(s.per_stream(&records), vec![0, 2, 1]);
        assert_eq!(s.routing.stream_of(&records[2]), 1);
    }

    #[test]
    fn positions_must_end_at_the_last_sequence() {
        assert!(positions_cover(&[end("a", 5, Some(6), None), end("b", 0, Some(1), None)], 5).ok);
        assert!(
            !positions_cover(&[end("a", 5, Some(5), None)], 0).ok,
            "behind"
        );
        assert!(
            !positions_cover(&[end("a", 5, Some(7), None)], 0).ok,
            "ahead"
        );
        assert!(!positions_cover(&[end("a", 5, None, None)], 0).ok);
        let again = positions_cover(&[end("a", 5, Some(6), None)], 6);
        assert!(again.ok && again.detail.contains("1 committed again"));
        assert!(!positions_cover(&[], 0).ok);
    }

    #[test]
    fn a_position_goes_back_only_to_a_sequence_read_again() {
        let names = vec!["a".to_owned(), "b".to_owned()];
        let back = |partition: i32, to: i64| Samples {
            samples: 10,
            regressions: vec![super::super::offsets::Regression {
                partition,
                from: 500,
                to,
                at_s: 3.0,
            }],
            ..Samples::default()
        };
        let announced = [Rewind {
            stream: "b".to_owned(),
            sequence: 300,
            reached: 500,
        }];
        assert!(positions_monotonic(&back(1, 300), &names, &announced).ok);
        assert!(positions_monotonic(&back(1, 320), &names, &announced).ok);
        assert!(
            !positions_monotonic(&back(1, 299), &names, &announced).ok,
            "below it"
        );
        assert!(
            !positions_monotonic(&back(0, 300), &names, &announced).ok,
            "another stream"
        );
        assert!(
            !positions_monotonic(&back(1, 300), &names, &[]).ok,
            "not announced"
        );
        assert!(
            positions_monotonic(
                &Samples {
                    samples: 3,
                    ..Samples::default()
                },
                &names,
                &[]
            )
            .ok
        );
    }

    #[test]
    fn a_gap_the_processors_saw_fails() {
        assert!(no_offset_gaps(&[Contents::default()], 0).ok);
        assert!(!no_offset_gaps(&[Contents::default()], 3).ok);
    }

    #[test]
    fn a_consumer_with_work_left_or_unread_fails() {
        assert!(consumers_drained(&[end("a", 5, Some(6), Some((0, 0)))]).ok);
        assert!(!consumers_drained(&[end("a", 5, Some(6), Some((1, 0)))]).ok);
        assert!(!consumers_drained(&[end("a", 5, Some(6), Some((0, 3)))]).ok);
        assert!(!consumers_drained(&[end("a", 5, Some(6), None)]).ok);
        assert!(!consumers_drained(&[]).ok);
    }

    #[test]
    fn the_streams_model_counts_every_stored_copy() {
        let id = "0190a0a0-0000-4000-8000-000000000001";
        let input = [record(1, 5, Some(id)), record(1, 3, None)];
        let stored = Contents {
            // The valid record stored twice (a copy published again after the window), the
            // one without an id too: the copy is skipped, the id-less one dead-lettered twice.
            records: vec![
                input[0].clone(),
                input[1].clone(),
                input[0].clone(),
                input[1].clone(),
            ],
            first_seq: 1,
            last_seq: 4,
            gaps: 0,
        };
        let of_streams = model_of(std::slice::from_ref(&stored));
        assert_eq!(of_streams.balances, BTreeMap::from([(1, 5)]));
        assert_eq!(of_streams.duplicates, 1);
        assert_eq!(of_streams.dead_letters.get("missing_id"), Some(&2));
        let mut model = Model::default();
        input.iter().for_each(|r| model.apply(r));
        let valid = HashSet::from([Uuid::parse_str(id).unwrap()]);
        assert!(
            streams_hold_input(
                std::slice::from_ref(&stored),
                &valid,
                &of_streams,
                model.expected()
            )
            .ok
        );
        let lost = Contents {
            records: vec![input[1].clone()],
            ..stored
        };
        let of_lost = model_of(std::slice::from_ref(&lost));
        assert!(!streams_hold_input(&[lost], &valid, &of_lost, model.expected()).ok);
    }
}

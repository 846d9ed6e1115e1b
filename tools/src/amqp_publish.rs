//! `amqp-publish`: the generated ledger records to RabbitMQ queues, as a service that publishes
//! them would: persistent messages with the record id in the `message_id` property (none for a
//! record without an id), the value as the body (empty for a record without one), the send time
//! in the `timestamp` property, confirmed by the broker. With several queues, each account's
//! records go to one queue (by account id), so that each account's order holds as on a Kafka
//! partition and the model's overdraft decisions stay right.

use anyhow::Context;
use batch_inbox::internals::amqp::declare;
use batch_inbox::QueueType;
use futures::stream::{FuturesUnordered, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};

use crate::generate::Record;

/// Most publishes awaiting their confirmation at once.
const IN_FLIGHT: usize = 5_000;

/// The broker and the queues of `amqp-publish` and `amqp-consume-only`.
#[derive(Debug, Clone, clap::Args)]
pub struct QueuesArgs {
    /// The broker (`amqp://user:password@host:port/vhost`).
    #[arg(long, env = "AMQP_URL")]
    pub url: String,
    /// The queues (repeatable), declared as the processor declares them.
    #[arg(long = "queue", required = true)]
    pub queues: Vec<String>,
    /// The queues' type when they are declared: classic or quorum.
    #[arg(long, value_parser = batch_inbox::internals::flags::named::<QueueType>(), default_value_t = QueueType::Classic)]
    pub queue_type: QueueType,
}

/// `amqp-publish` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AmqpPublishArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub target: QueuesArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub generator: crate::cli::GeneratorArgs,
    /// Write the expected outcome (counts, balances) as JSON to this file.
    #[arg(long)]
    pub expect: Option<std::path::PathBuf>,
    /// Publish at this many records per second (paced, for latency at a fixed rate) instead of
    /// as fast as the broker confirms.
    #[arg(long)]
    pub rate: Option<f64>,
}

/// A record's properties: persistent, its id in `message_id`, the send time in the `timestamp`
/// property (seconds) and, to the millisecond, in the `timestamp_in_ms` header (what RabbitMQ's
/// message timestamp interceptor sets; the processor measures end-to-end latency from it).
fn properties_of(record: &Record) -> BasicProperties {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from("timestamp_in_ms"),
        AMQPValue::LongLongInt(i64::try_from(now.as_millis()).unwrap_or(i64::MAX)),
    );
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_timestamp(now.as_secs())
        .with_headers(headers);
    if let Some(id) = &record.id {
        properties = properties.with_message_id(ShortString::from(id.as_str()));
    }
    properties
}

/// The queue of an account's records among `n`.
fn queue_of(record: &Record, n: usize) -> usize {
    let account: u64 = record.key.parse().unwrap_or(0);
    (account % n as u64) as usize
}

/// Publishes `records` to `queues` with publisher confirms; returns how many were confirmed.
pub async fn publish(
    url: &str,
    queues: &[String],
    kind: QueueType,
    records: Vec<Record>,
) -> anyhow::Result<u64> {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .context("connecting to RabbitMQ")?;
    let channel = connection.create_channel().await?;
    for q in queues {
        declare(&channel, q, kind)
            .await
            .with_context(|| format!("declaring queue {q}"))?;
    }
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut pending = FuturesUnordered::new();
    let mut confirmed = 0u64;
    for record in records {
        let queue = &queues[queue_of(&record, queues.len())];
        let properties = properties_of(&record);
        let body = record.value.unwrap_or_default();
        let confirm = channel
            .basic_publish(
                ShortString::from(""),
                ShortString::from(queue.as_str()),
                BasicPublishOptions::default(),
                &body,
                properties,
            )
            .await?;
        pending.push(confirm);
        while pending.len() >= IN_FLIGHT {
            if let Some(c) = pending.next().await {
                anyhow::ensure!(c?.is_ack(), "the broker refused a publish (nack)");
                confirmed += 1;
            }
        }
    }
    while let Some(c) = pending.next().await {
        anyhow::ensure!(c?.is_ack(), "the broker refused a publish (nack)");
        confirmed += 1;
    }
    let _ = connection.close(200, ShortString::from("published")).await;
    Ok(confirmed)
}

/// Runs `amqp-publish`.
pub async fn run(args: AmqpPublishArgs) -> anyhow::Result<()> {
    let (records, expected) = crate::generate::generate(args.generator.settings());
    let started = std::time::Instant::now();
    let t = &args.target;
    let n = match args.rate {
        Some(rate) => {
            let give_up = std::time::Duration::from_secs(60);
            // As many in flight as the unpaced publisher: at 20,000/s and 20 ms per confirm,
            // 400 await theirs at any time.
            publish_paced(
                &t.url,
                &t.queues,
                t.queue_type,
                records,
                rate,
                give_up,
                IN_FLIGHT,
            )
            .await?
            .confirmed
        }
        None => publish(&t.url, &t.queues, t.queue_type, records).await?,
    };
    let secs = started.elapsed().as_secs_f64();
    println!(
        "published {n} records in {secs:.1}s ({:.0}/s)",
        n as f64 / secs
    );
    if let Some(path) = args.expect {
        std::fs::write(&path, serde_json::to_vec_pretty(&expected)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `amqp-consume-only` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AmqpConsumeOnlyArgs {
    /// The queues to read, each on a channel of its own.
    #[command(flatten)]
    pub source: QueuesArgs,
    /// Deliveries to read in all; the run ends when they are read and acknowledged.
    #[arg(long)]
    pub messages: u64,
    /// Deliveries acknowledged with one `basic.ack` (multiple), as the processor's batches are.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: u64,
    /// Write `{"records", "window_s", "msgs_per_sec"}` (first delivery to the last ack) here.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// The broker's own floor: every queue read with the processor's prefetch (two batches) and
/// acknowledged by batches (`multiple`), nothing applied. Ends once `messages` are acknowledged.
pub async fn consume_only(args: AmqpConsumeOnlyArgs) -> anyhow::Result<()> {
    use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
    let connection = Connection::connect(&args.source.url, ConnectionProperties::default())
        .await
        .context("connecting to RabbitMQ")?;
    let prefetch = u16::try_from(args.batch_size.saturating_mul(2)).unwrap_or(u16::MAX);
    let mut tasks = Vec::new();
    let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let first = std::sync::Arc::new(std::sync::OnceLock::<std::time::Instant>::new());
    for q in &args.source.queues {
        let channel = connection.create_channel().await?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await?;
        declare(&channel, q, args.source.queue_type).await?;
        let mut consumer = channel
            .basic_consume(
                ShortString::from(q.as_str()),
                ShortString::from(""),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let (read, first, total, batch) =
            (read.clone(), first.clone(), args.messages, args.batch_size);
        tasks.push(tokio::spawn(async move {
            let mut last: Option<lapin::Acker> = None;
            let mut unacked = 0u64;
            loop {
                // Acknowledge what is in hand once nothing more is ready; with nothing in hand,
                // look every 50 ms whether the run is done (this queue may be empty for good).
                let wait = match last {
                    None => std::time::Duration::from_millis(50),
                    Some(_) => std::time::Duration::from_millis(1),
                };
                let next = tokio::time::timeout(wait, consumer.next())
                    .await
                    .unwrap_or(None);
                match next {
                    Some(Ok(d)) => {
                        first.get_or_init(std::time::Instant::now);
                        last = Some(d.acker);
                        unacked += 1;
                        let n = read.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
                        if unacked >= batch || n >= total {
                            if let Some(a) = last.take() {
                                a.ack(BasicAckOptions { multiple: true }).await?;
                            }
                            unacked = 0;
                        }
                    }
                    Some(Err(e)) => return Err(anyhow::Error::from(e)),
                    None => {
                        if let Some(a) = last.take() {
                            a.ack(BasicAckOptions { multiple: true }).await?;
                            unacked = 0;
                        }
                    }
                }
                if read.load(std::sync::atomic::Ordering::Acquire) >= total && last.is_none() {
                    return Ok(());
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let window = first.get().map_or(0.0, |f| f.elapsed().as_secs_f64());
    let records = read.load(std::sync::atomic::Ordering::Acquire);
    let report = serde_json::json!({
        "records": records,
        "window_s": window,
        "msgs_per_sec": records as f64 / window.max(1e-9),
    });
    println!("{report}");
    if let Some(path) = args.out {
        std::fs::write(&path, report.to_string())?;
    }
    let _ = connection.close(200, ShortString::from("done")).await;
    Ok(())
}

/// What [`publish_paced`] did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Published {
    /// Publishes the broker confirmed, copies included.
    pub confirmed: u64,
    /// Distinct records confirmed, per queue (in the order of the queues).
    pub per_queue: Vec<u64>,
    /// Records published again after a publish whose outcome was unknown (its channel died
    /// before the confirmation): each is in its queue once or twice.
    #[serde(skip)]
    pub republished: Vec<Record>,
    /// How many records were published again.
    pub republished_records: u64,
    /// Connections opened again after the broker went away.
    pub reconnects: u64,
}

/// Most paced publishes awaiting their confirmation at once in the chaos run: a broker killed
/// with them in flight leaves their outcome unknown, so they are published again (and may be in
/// their queue twice). A paced publisher catching up after an outage needs no more than this to
/// keep a pace of a few thousand per second.
pub const PACED_IN_FLIGHT: usize = 256;

/// The longest wait for a confirmation before the channel is taken for dead.
const CONFIRM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// One connection's channel with confirms on and every queue declared.
async fn confirmed_channel(
    url: &str,
    queues: &[String],
    kind: QueueType,
) -> anyhow::Result<(Connection, lapin::Channel)> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    for q in queues {
        declare(&channel, q, kind).await?;
    }
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok((connection, channel))
}

/// Publishes `records` to `queues` as [`publish`] does, paced at `rate` per second, and goes on
/// through broker restarts as a service that publishes at least once would: when the channel
/// dies, every publish not yet confirmed is published again on a new connection (so it may be
/// in its queue twice; the inbox skips the copy). Gives up once the broker stayed unreachable
/// for `give_up`. An error never shows the URL.
pub async fn publish_paced(
    url: &str,
    queues: &[String],
    kind: QueueType,
    records: Vec<Record>,
    rate: f64,
    give_up: std::time::Duration,
    most_in_flight: usize,
) -> anyhow::Result<Published> {
    anyhow::ensure!(
        rate.is_finite() && rate > 0.0,
        "the rate must be a number of records per second above 0"
    );
    use futures::FutureExt;
    use std::collections::VecDeque;
    use tokio::time::{sleep_until, timeout, Instant};

    let started = Instant::now();
    let n = records.len();
    let mut confirmed_once = vec![false; n];
    let mut again = vec![false; n];
    let mut resend: VecDeque<usize> = VecDeque::new();
    let mut next = 0usize;
    let mut out = Published::default();
    let mut unreachable_since: Option<Instant> = None;
    while next < n || !resend.is_empty() {
        let (connection, channel) = match confirmed_channel(url, queues, kind).await {
            Ok(c) => {
                unreachable_since = None;
                c
            }
            Err(_) => {
                let since = *unreachable_since.get_or_insert_with(Instant::now);
                anyhow::ensure!(
                    since.elapsed() < give_up,
                    "RabbitMQ stayed unreachable for {give_up:?} while publishing"
                );
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                continue;
            }
        };
        if out.confirmed > 0 || !resend.is_empty() {
            out.reconnects += 1;
        }
        let mut pending = FuturesUnordered::new();
        let mut in_flight = std::collections::HashSet::new();
        let mut alive = true;
        while alive && (next < n || !resend.is_empty() || !pending.is_empty()) {
            // Settle what is confirmed; wait for some when too many are in flight, or at the end.
            let must_wait =
                pending.len() >= most_in_flight.max(1) || (next >= n && resend.is_empty());
            loop {
                let got = if must_wait && !pending.is_empty() {
                    match timeout(CONFIRM_TIMEOUT, pending.next()).await {
                        Ok(got) => got,
                        Err(_) => {
                            alive = false;
                            break;
                        }
                    }
                } else {
                    match pending.next().now_or_never() {
                        Some(got) => got,
                        None => break,
                    }
                };
                let Some((i, result)): Option<(usize, lapin::Result<lapin::Confirmation>)> = got
                else {
                    break;
                };
                in_flight.remove(&i);
                match result {
                    Ok(c) if c.is_ack() => {
                        confirmed_once[i] = true;
                        out.confirmed += 1;
                    }
                    _ => {
                        // A nack or a channel that died: published again on a new channel.
                        again[i] = true;
                        resend.push_back(i);
                        alive = false;
                    }
                }
                if must_wait {
                    break;
                }
            }
            if !alive {
                break;
            }
            let i = match resend.pop_front() {
                Some(i) => i,
                None if next < n => {
                    let due =
                        started + std::time::Duration::from_secs_f64(next as f64 / rate.max(1e-9));
                    sleep_until(due).await;
                    next += 1;
                    next - 1
                }
                None => continue,
            };
            let record = &records[i];
            let queue = &queues[queue_of(record, queues.len())];
            let properties = properties_of(record);
            let body = record.value.clone().unwrap_or_default();
            match channel
                .basic_publish(
                    ShortString::from(""),
                    ShortString::from(queue.as_str()),
                    BasicPublishOptions::default(),
                    &body,
                    properties,
                )
                .await
            {
                Ok(confirm) => {
                    in_flight.insert(i);
                    pending.push(confirm.map(move |r| (i, r)));
                }
                Err(_) => {
                    again[i] = true;
                    resend.push_back(i);
                    alive = false;
                }
            }
        }
        // The channel died: what it did not confirm is published again (its outcome unknown).
        drop(pending);
        let mut unsettled: Vec<usize> = in_flight.drain().collect();
        unsettled.sort_unstable();
        for i in unsettled {
            again[i] = true;
            resend.push_back(i);
        }
        let _ = timeout(
            std::time::Duration::from_secs(2),
            connection.close(200, ShortString::from("published")),
        )
        .await;
    }
    anyhow::ensure!(
        confirmed_once.iter().all(|c| *c),
        "some records were never confirmed"
    );
    out.per_queue = vec![0; queues.len()];
    for r in &records {
        out.per_queue[queue_of(r, queues.len())] += 1;
    }
    out.republished = records
        .iter()
        .zip(&again)
        .filter(|(_, a)| **a)
        .map(|(r, _)| r.clone())
        .collect();
    out.republished_records = out.republished.len() as u64;
    Ok(out)
}

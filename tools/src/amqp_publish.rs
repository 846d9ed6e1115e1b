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
use lapin::types::{FieldTable, ShortString};
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
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut pending = FuturesUnordered::new();
    let mut confirmed = 0u64;
    for record in records {
        let queue = &queues[queue_of(&record, queues.len())];
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_timestamp(now);
        if let Some(id) = &record.id {
            properties = properties.with_message_id(ShortString::from(id.as_str()));
        }
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
    let n = publish(&t.url, &t.queues, t.queue_type, records).await?;
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

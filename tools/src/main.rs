//! The `batch-inbox-bench` binary: the toolbox's command line.

use anyhow::Context;
use batch_inbox::db;
use batch_inbox_tools::cli::{Cli, Command, CopyCeilingArgs, DemoArgs, ProduceArgs, VerifyArgs};
use batch_inbox_tools::report::RunReport;
use clap::Parser;

// The product binary's allocator, so that the replay's own CPU compares with the processor's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,rdkafka=warn,async_nats=warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Produce(args) => produce(args).await,
        Command::AmqpPublish(args) => batch_inbox_tools::amqp_publish::run(args).await,
        Command::AmqpConsumeOnly(args) => batch_inbox_tools::amqp_publish::consume_only(args).await,
        Command::NatsPublish(args) => batch_inbox_tools::nats_publish::run(args).await,
        Command::NatsStreamInfo(args) => batch_inbox_tools::nats_publish::stream_info(args).await,
        Command::NatsConsumeOnly(args) => batch_inbox_tools::nats_publish::consume_only(args).await,
        Command::Verify(args) => verify(args).await,
        Command::Demo(args) => demo(args).await,
        Command::Drain(args) => batch_inbox_tools::drain::drain(args).await,
        Command::ConsumeOnly(args) => batch_inbox_tools::drain::consume_only(args).await,
        Command::Summary(args) => batch_inbox_tools::summary::write(&args.input, &args.output)
            .map(|files| files.iter().for_each(|f| println!("wrote {}", f.display())))
            .map_err(Into::into),
        Command::CopyCeiling(args) => copy_ceiling(args).await,
        Command::Chaos(cli) => match (cli.command, cli.run) {
            (Some(batch_inbox_tools::chaos::ChaosCommand::Summary(a)), _) => {
                batch_inbox_tools::chaos::summary::of_dir(&a.dir).map(|md| print!("{md}"))
            }
            (None, Some(args)) => return chaos(args).await,
            (None, None) => Err(anyhow::anyhow!(
                "chaos: give the run's flags (see chaos --help) or `chaos summary DIR`"
            )),
        },
        Command::Replay(args) => batch_inbox_tools::replay::replay(args).await,
        Command::DelayProxy(args) => batch_inbox_tools::delay_proxy::serve(args).await,
        Command::Cpu(args) => batch_inbox_tools::cpu::sample::run(args),
        Command::Peers(args) => batch_inbox_tools::peers::run(args).await,
        Command::BestRate(args) => best_rate(&args),
        Command::Machine(args) => batch_inbox_tools::machine::run(&args).await,
        Command::Report(args) => batch_inbox_tools::report::run(&args),
        Command::Recovery(args) => batch_inbox_tools::recovery::run(args).await,
        Command::Kafka(args) => batch_inbox_tools::kafka_output::run(&args),
        Command::ReplayCompare(args) => batch_inbox_tools::replay_compare::run(&args),
        Command::GroupProtocolReport(args) => batch_inbox_tools::group_protocol::run(&args),
        Command::OutageLines(args) => batch_inbox_tools::outage_lines::run(&args),
        Command::Json(args) => batch_inbox_tools::json_get::run(&args),
        Command::Soak(args) => batch_inbox_tools::soak::run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", batch_inbox::one_line_error(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn produce(args: ProduceArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.kafka.topics.len() == 1,
        "produce writes to one topic: give --topic once"
    );
    let brokers = &args.kafka.brokers;
    batch_inbox_tools::produce::ensure_topic(brokers, args.kafka.topic(), args.partitions)
        .await
        .context("creating the topic")?;
    let (records, expected) = batch_inbox_tools::generate::generate(args.generator.settings());
    let records: Vec<_> = records
        .into_iter()
        .map(|r| args.envelope.write(r))
        .collect();
    let producer = batch_inbox_tools::produce::producer(brokers, &args.kafka.properties)?;
    if args.rate.is_some() {
        batch_inbox_tools::produce::warm_up(brokers, &producer, args.kafka.topic())
            .await
            .context("warming up the producer")?;
    }
    let started = std::time::Instant::now();
    let mut progress = Progress::new(records.len() as u64);
    let batch_inbox_tools::produce::Sent {
        delivered: sent,
        acked_ms,
    } = batch_inbox_tools::produce::send_paced(
        &producer,
        args.kafka.topic(),
        records,
        args.rate,
        |n| progress.update(n),
    )
    .await?;
    progress.finish();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "produced {sent} records in {secs:.1}s ({:.0}/s)",
        sent as f64 / secs
    );
    if let Some(path) = args.expect {
        std::fs::write(&path, serde_json::to_vec_pretty(&expected)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = args.ack_report {
        std::fs::write(&path, serde_json::to_vec_pretty(&acked_ms)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A progress bar on a terminal; a plain line at every quarter otherwise.
enum Progress {
    Bar(indicatif::ProgressBar),
    Lines { total: u64, next: u64 },
}

impl Progress {
    fn new(total: u64) -> Self {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {per_sec} eta {eta}")
                    .expect("static template is valid"),
            );
            Progress::Bar(bar)
        } else {
            Progress::Lines {
                total,
                next: total / 4,
            }
        }
    }

    fn update(&mut self, delivered: u64) {
        match self {
            Progress::Bar(bar) => bar.set_position(delivered),
            Progress::Lines { total, next } => {
                if delivered >= *next && *next < *total {
                    eprintln!("delivered {delivered} of {total}");
                    *next += (*total / 4).max(1);
                }
            }
        }
    }

    fn finish(self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// `demo`: creates a database of its own, applies a generated input through an in-process mock
/// cluster, checks the result against the model, and drops the database (unless `--keep`).
async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let own = batch_inbox_tools::demo::OwnDatabase::create(&args.server_url).await?;
    println!("database        {} (created for this demo)", own.name);
    let outcome = demo_in(&own.url, &args).await;
    if args.keep {
        println!("kept            {}", own.name);
    } else {
        own.drop_database().await?;
    }
    outcome
}

async fn demo_in(url: &str, args: &DemoArgs) -> anyhow::Result<()> {
    let pool = db::connect(url, args.pipeline.pool_size.get()).await?;
    db::migrate(&pool).await?;
    batch_inbox::ledger::migrate(&pool).await?;
    let pipeline = args.pipeline.clone();
    let report =
        batch_inbox_tools::demo::run(pool, args.generator.settings(), args.partitions, |k| {
            pipeline.processor(k, true)
        })
        .await?;
    let s = report.stats;
    let e = &report.expected;
    let secs = report.elapsed.as_secs_f64();
    println!(
        "mode            {:?}, batch size {}",
        args.pipeline.mode, args.pipeline.batch_size
    );
    println!("messages        {}", s.records);
    println!("new (applied)   {}", s.new - s.rejected);
    println!("duplicates      {}", s.duplicates);
    println!(
        "dead-lettered   {} (bad input {}, insufficient funds {})",
        s.invalid + s.rejected,
        s.invalid,
        s.rejected
    );
    println!("transactions    {}", s.transactions);
    println!(
        "elapsed         {secs:.2}s including the group join ({:.0} msgs/s)",
        s.records as f64 / secs
    );
    println!("sum of balances {}", e.total());
    if report.differences.is_empty() {
        println!(
            "verified        database equals the model: {} inbox ids, {} balances",
            e.new,
            e.balances.len()
        );
        Ok(())
    } else {
        anyhow::bail!(
            "database differs from the model: {}",
            report.differences.join("; ")
        )
    }
}

async fn verify(args: VerifyArgs) -> anyhow::Result<()> {
    let expected = batch_inbox_tools::verify::read_expected(&args.expect)?;
    let pool = db::connect(args.db.database_url.expose(), 1).await?;
    let observed = batch_inbox_tools::verify::observe(&**pool.get().await?).await?;
    let diffs = batch_inbox_tools::verify::differences(&observed, &expected);
    if !diffs.is_empty() {
        anyhow::bail!("FAIL: {}", diffs.join("; "));
    }
    println!(
        "PASS: {} inbox ids, {} dead letters, {} balances summing to {}",
        expected.new,
        expected.dead_letters.values().sum::<u64>(),
        expected.balances.len(),
        expected.total()
    );
    Ok(())
}

fn best_rate(args: &batch_inbox_tools::cli::BestRateArgs) -> anyhow::Result<()> {
    let best = batch_inbox_tools::report::best_rate(&args.runs, &args.prefix)
        .with_context(|| format!("reading {}", args.runs.display()))?;
    match (best, args.or) {
        // Whole msgs/s, cut as the rates of the runs derived from it are.
        (Some(rate), _) => println!("{}", rate as u64),
        (None, Some(or)) => println!("{or}"),
        (None, None) => anyhow::bail!(
            "no run report {}*.json in {}",
            args.prefix,
            args.runs.display()
        ),
    }
    Ok(())
}

async fn copy_ceiling(args: CopyCeilingArgs) -> anyhow::Result<()> {
    let pool = db::connect(args.db.database_url.expose(), args.streams.max(1)).await?;
    let (rows, secs) = batch_inbox_tools::measure::copy_ceiling(&pool, args.streams).await?;
    let rate = rows as f64 / secs.max(1e-9);
    println!(
        "COPY {rows} ids in {secs:.2}s ({rate:.0}/s) over {} streams",
        args.streams
    );
    if let Some(path) = &args.report {
        let mut report = RunReport {
            label: "copy-ceiling".to_owned(),
            ..RunReport::default()
        };
        report.settings.mode = "copy".to_owned();
        report.settings.pool_size = args.streams as u64;
        (report.window_s, report.msgs_per_sec) = (secs, rate);
        report.stats.records = rows;
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn chaos(args: batch_inbox_tools::chaos::ChaosArgs) -> std::process::ExitCode {
    match batch_inbox_tools::chaos::run(args).await {
        Ok(report) if report.passed => std::process::ExitCode::SUCCESS,
        Ok(_) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("error: chaos run failed: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

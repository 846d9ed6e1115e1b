use super::*;
use crate::cli::handler::HandlerKind;
use batch_inbox::Mode;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("batch-inbox").chain(args.iter().copied()))
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    for (args, needle) in [
        (vec!["run", "--batch-size", "0"], "--batch-size"),
        (vec!["run", "--mode", "sometimes"], "--mode"),
        (vec!["run", "-X", "novalue"], "KEY=VALUE"),
        // Consume-only stores offsets without applying: not a value of the command line.
        (vec!["run", "--mode", "consume-only"], "--mode"),
        (vec!["produce"], "unrecognized subcommand"),
        (vec!["run", "--retention", "7"], "unit"),
        (vec!["cleanup", "--retention", "0d"], "zero"),
        (vec!["cleanup"], "--retention"),
        (
            vec!["run", "--max-poison-rate", "0/1m"],
            "--max-poison-rate",
        ),
        (vec!["run", "--max-poison-rate", "often"], "N/DURATION"),
        (
            vec!["run", "--statement-timeout", "1y"],
            "--statement-timeout",
        ),
    ] {
        let err = parse(&args).unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn a_bad_property_is_refused_without_quoting_it() {
    let err = parse(&["run", "-X", "sasl.password:Sup3rS3cretPw"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("-X expects KEY=VALUE") && !err.contains("Sup3rS3cretPw"),
        "{err}"
    );
}

#[test]
fn a_linger_that_would_overflow_a_deadline_is_refused() {
    let err = parse(&["run", "--batch-linger-ms", "18446744073709551615"]).unwrap_err();
    assert!(err.to_string().contains("--batch-linger-ms"), "{err}");
    let Command::Run(run) = parse(&["run", "--batch-linger-ms", "3600000"])
        .unwrap()
        .command
    else {
        panic!("not run")
    };
    assert_eq!(
        run.processor().worker.batcher.linger,
        Duration::from_secs(3600)
    );
}

#[test]
fn flags_become_typed_settings() {
    let cli = parse(&[
        "run",
        "--mode",
        "per-message",
        "--batch-size",
        "7",
        "--batch-linger-ms",
        "3",
        "-X",
        "fetch.min.bytes=1",
        "--id-header",
        "ce_id",
        "--exit-on-eof",
    ])
    .unwrap();
    let Command::Run(run) = cli.command else {
        panic!("not run")
    };
    let p = run.processor();
    assert_eq!(p.worker.mode, Mode::PerMessage);
    assert_eq!(p.worker.batcher.max_items.get(), 7);
    assert_eq!(p.worker.batcher.linger, Duration::from_millis(3));
    assert_eq!(p.decoding.ids.header, "ce_id");
    assert_eq!(p.dedup_window, None, "no guard without a retention");
    assert_eq!(
        p.worker.max_poison_rate,
        Some(batch_inbox::PoisonRate::DEFAULT),
        "the breaker is on by default"
    );
    assert_eq!(p.statement_timeout, Some(Duration::from_secs(30)));
    assert!(p.exit_on_eof && p.kafka.partition_eof);
    assert_eq!(
        p.kafka.overrides,
        vec![("fetch.min.bytes".into(), "1".into())]
    );
    let config = p.kafka.client_config();
    assert_eq!(config.get("enable.auto.offset.store"), Some("false"));
    assert_eq!(config.get("fetch.min.bytes"), Some("1"));
}

#[test]
fn the_breaker_can_be_turned_off_and_a_zero_timeout_is_the_servers() {
    let Command::Run(run) = parse(&[
        "run",
        "--max-poison-rate",
        "off",
        "--statement-timeout",
        "0",
    ])
    .unwrap()
    .command
    else {
        panic!("not run")
    };
    let p = run.processor();
    assert_eq!(p.worker.max_poison_rate, None);
    assert_eq!(p.statement_timeout, None);
}

#[test]
fn the_breaker_takes_a_share_and_the_old_count_per_duration_as_its_floor() {
    let worker = |value: &str| {
        let Command::Run(run) = parse(&["run", "--max-poison-rate", value]).unwrap().command else {
            panic!("not run")
        };
        run.processor().worker
    };
    let w = worker("10%/1000,min=5");
    let floor = w.max_poison_rate.expect("on");
    assert_eq!(
        (w.poison_share.percent, w.poison_share.window, floor.count),
        (10, 1000, 5)
    );
    let w = worker("3/1m");
    let floor = w.max_poison_rate.expect("on");
    assert_eq!(w.poison_share, batch_inbox::PoisonShare::DEFAULT);
    assert_eq!((floor.count, floor.per), (3, Duration::from_secs(60)));
    let w = worker("50%/100");
    assert_eq!(
        w.max_poison_rate.map(|f| f.count),
        Some(20),
        "the default floor"
    );
    assert!(parse(&["run", "--max-poison-rate", "50%/100,min=100"]).is_err());
}

#[test]
fn unsafe_controls_are_hidden_and_off_by_default() {
    let Command::Run(run) = parse(&["run"]).unwrap().command else {
        panic!("not run")
    };
    assert!(run.processor().worker.unsafe_controls.switches().is_empty());
    assert!(
        run.processor().offsets_in_db,
        "offsets in the database by default"
    );
    let Command::Run(run) = parse(&["run", "--offsets-in-db=false"]).unwrap().command else {
        panic!("not run")
    };
    assert!(!run.processor().offsets_in_db);
    let unsafe_flags = ["run", "--unsafe-offsets-before-commit", "--unsafe-no-inbox"];
    if cfg!(feature = "unsafe-controls") {
        let Command::Run(run) = parse(&unsafe_flags).unwrap().command else {
            panic!("not run")
        };
        assert_eq!(run.processor().worker.unsafe_controls.switches().len(), 2);
    } else {
        let err = parse(&unsafe_flags).unwrap_err().to_string();
        assert!(err.contains("unexpected argument"), "{err}");
    }
    let help = parse(&["run", "--help"]).unwrap_err().to_string();
    assert!(
        help.contains("--batch-size") && !help.contains("unsafe"),
        "{help}"
    );
}

#[test]
fn the_sql_handler_needs_its_statement_and_the_statement_its_handler() {
    let err = parse(&["run", "--handler", "sql"]).unwrap_err().to_string();
    assert!(err.contains("--apply-sql"), "{err}");
    let run = |args: &[&str]| match parse(args).unwrap().command {
        Command::Run(run) => run,
        _ => panic!("not run"),
    };
    let sql = run(&["run", "--handler", "sql", "--apply-sql", "x.sql"]);
    assert_eq!(sql.handler.kind, HandlerKind::Sql);
    assert_eq!(sql.check_handler(), Ok(()));
    let ledger = run(&["run"]);
    assert_eq!(
        (ledger.handler.kind, ledger.check_handler()),
        (HandlerKind::Ledger, Ok(()))
    );
    let stray = run(&["run", "--apply-sql", "x.sql"]);
    assert!(stray.check_handler().unwrap_err().contains("--handler sql"));
}

#[test]
fn retention_turns_on_the_dedup_window_guard() {
    let cli = parse(&["run", "--retention", "7d", "--cleanup-batch-rows", "100"]).unwrap();
    let Command::Run(run) = cli.command else {
        panic!("not run")
    };
    let week = Duration::from_secs(7 * 86_400);
    assert_eq!(run.processor().dedup_window, Some(week));
    let settings = run.cleanup.settings(week);
    assert_eq!((settings.retention, settings.batch_rows), (week, 100));
    let cli = parse(&["run", "--retention", "7d", "--dedup-window", "2d"]).unwrap();
    let Command::Run(run) = cli.command else {
        panic!("not run")
    };
    assert_eq!(
        run.processor().dedup_window,
        Some(Duration::from_secs(2 * 86_400))
    );
}

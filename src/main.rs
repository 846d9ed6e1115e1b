//! The `batch-inbox` binary: parses the command line and calls the library.

mod cli;

use cli::actions::{cleanup, list, migrate, redrive, set_positions};
use cli::commands::Command;
use cli::config_file::{self, ConfigError};
use cli::dead_letters::DeadLettersCommand;
use cli::positions::PositionsCommand;
use cli::run::{print_settings, run};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let loaded = match config_file::load(std::env::args_os()) {
        Ok(loaded) => loaded,
        Err(ConfigError::Cli(e)) => config_file::hide_stray_value(e).exit(),
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // Failpoints (fault tests only) are configured by the FAILPOINTS environment variable.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    cli::logging::init(loaded.cli.log_format);
    let result = match loaded.cli.command {
        Command::Migrate(args) => migrate(args).await,
        Command::Cleanup(args) => cleanup(args).await,
        Command::DeadLetters(d) => match d.command {
            DeadLettersCommand::List(args) => list(args).await,
            DeadLettersCommand::Redrive(args) => match args.handler.check() {
                Ok(()) => redrive(*args).await,
                Err(refused) => {
                    eprintln!("error: {refused}");
                    return std::process::ExitCode::from(2);
                }
            },
        },
        Command::Positions(p) => match p.command {
            PositionsCommand::Set(args) => set_positions(*args).await,
        },
        Command::Run(args) if args.ops.print_config => {
            print_settings(&loaded.settings);
            Ok(())
        }
        Command::Run(args) => match args
            .check_handler()
            .and_then(|()| args.processor().check().map_err(|e| e.to_string()))
        {
            Ok(()) => run(*args).await,
            Err(refused) => {
                eprintln!("error: {refused}");
                return std::process::ExitCode::from(2);
            }
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", batch_inbox::one_line_error(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

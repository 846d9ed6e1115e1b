//! The `batch-inbox` binary's command line: its commands and flags with their environment
//! fallbacks (`args`, `commands`, `dead_letters`, `retention`), the TOML config file and
//! `--print-config` with every secret redacted (`config_file`), and the log lines (`logging`);
//! what each command does (`actions`, and `run`: the library's service).
//!
//! Everything here converts into the library's plain types (`ProcessorConfig`,
//! `RetentionSettings`, `redrive::Selection`, …): the library itself knows no command line.

pub mod actions;
pub mod args;
pub mod commands;
pub mod config_file;
pub mod dead_letters;
pub mod handler;
pub mod logging;
pub mod positions;
pub mod retention;
pub mod run;

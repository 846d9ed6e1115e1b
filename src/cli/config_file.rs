//! The optional TOML configuration file (`--config FILE`, or `BATCH_INBOX_CONFIG`).
//!
//! Keys are the long flag names (`batch-size = 500`, `database-url = "…"`); a repeatable flag
//! takes an array (`topic = ["orders", "refunds"]`, `apply-sql = ["orders=o.sql", "r.sql"]`);
//! librdkafka properties go in a `[librdkafka]` table.
//!
//! Invariant: the command line wins over the environment, which wins over the file, which wins
//! over the built-in defaults; and a file value is validated exactly like the same flag. To keep
//! it, the command line is parsed once to learn the subcommand, the file, and which arguments
//! the command line or the environment already set; the file's values for the others are
//! inserted as flags right after the subcommand (its `[librdkafka]` properties before any `-X`
//! of the command line, so those apply last), and the result is parsed again.
//!
//! A key that is no flag of any command is an error; a key of another command is ignored, so one
//! file can serve `migrate` and `run`.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches};

use super::commands::Cli;
use batch_inbox::internals::secret::{redact_database_url, redact_property_arg, MASK};

/// The table of librdkafka properties.
pub const LIBRDKAFKA_TABLE: &str = "librdkafka";

/// Why the command line and the file could not be combined.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The command line itself is wrong (or asks for help): clap reports it.
    #[error("{0}")]
    Cli(#[from] clap::Error),
    /// The file cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("config file {path} is not valid TOML: {message}")]
    Toml {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The subcommand does not read a config file: its settings would be silently ignored (the
    /// database URL of the file among them).
    #[error(
        "config file {path}: `{subcommand}` does not read a config file; pass its settings as \
         flags or environment variables (DATABASE_URL, --handler, --apply-sql)"
    )]
    NotRead {
        /// The file.
        path: PathBuf,
        /// The subcommand.
        subcommand: String,
    },
    /// A key names no flag.
    #[error("config file {path}: unknown key `{key}` (keys are long flag names: {known})")]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The accepted keys.
        known: String,
    },
    /// A value has the wrong shape or does not pass the flag's validation.
    #[error("config file {path}: `{key}`: {message}")]
    Value {
        /// The file.
        path: PathBuf,
        /// The key (or the flag clap complained about).
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// Where a setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The command line.
    Flag,
    /// An environment variable.
    Env,
    /// The config file.
    File,
    /// The built-in default.
    Default,
}

/// The parsed command line, and where each setting of the subcommand came from.
#[derive(Debug)]
pub struct Loaded {
    /// The command line with the file merged in.
    pub cli: Cli,
    /// (flag name, value, source) of every setting of the subcommand that has a value.
    pub settings: Vec<(String, String, Source)>,
}

/// Parses `args` (the program name first) and merges the config file they name, if any.
pub fn load<I, T>(args: I) -> Result<Loaded, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let mut cmd = Cli::command();
    cmd.build();
    let first = cmd.clone().try_get_matches_from(&args)?;
    let (sub, sub_matches) = first
        .subcommand()
        .expect("clap requires a subcommand (subcommand_required)");
    let mut injected = BTreeSet::new();
    let mut merged = args.clone();
    if let Some(path) = sub_matches.get_one::<PathBuf>("config") {
        // `dead-letters list|redrive` have flags of their own one level down, which the file
        // does not reach: refusing is safer than a redrive against the default database.
        if sub == "dead-letters" {
            return Err(ConfigError::NotRead {
                path: path.clone(),
                subcommand: sub.to_owned(),
            });
        }
        let table = read_table(path)?;
        check_keys(&cmd, path, &table)?;
        let sub_cmd = cmd
            .find_subcommand(sub)
            .expect("the subcommand was just parsed");
        let extra = file_args(sub_cmd, sub_matches, path, &table, &mut injected)?;
        let at = args
            .iter()
            .skip(1)
            .position(|a| a == sub)
            .map_or(args.len(), |i| i + 2);
        merged.splice(at..at, extra);
    }
    let matches = cmd.clone().try_get_matches_from(&merged).map_err(|e| {
        match (
            sub_matches.get_one::<PathBuf>("config"),
            injected.is_empty(),
        ) {
            (Some(path), false) => ConfigError::Value {
                path: path.clone(),
                key: rejected_flag(&e),
                message: first_line(&e.to_string()),
            },
            _ => ConfigError::Cli(e),
        }
    })?;
    let cli = Cli::from_arg_matches(&matches)?;
    let sub_cmd = cmd
        .find_subcommand(sub)
        .expect("the subcommand was just parsed");
    let settings = describe(sub_cmd, &matches, &injected);
    Ok(Loaded { cli, settings })
}

/// `e`, unless it quotes an argument that is no flag: a value separated from its flag (`-X
/// sasl.password SECRET`) may be a secret, so that error does not quote it.
pub fn hide_stray_value(e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let stray = matches!(
        e.get(ContextKind::InvalidArg),
        Some(ContextValue::String(arg)) if !arg.starts_with('-')
    );
    if e.kind() != ErrorKind::UnknownArgument || !stray {
        return e;
    }
    clap::Error::raw(
        ErrorKind::UnknownArgument,
        "unexpected argument, not shown: a value without its flag may be a secret (-X takes \
         KEY=VALUE as one argument)\n",
    )
}

/// The long name of the flag clap refused (`--batch-size <N>` → `batch-size`).
fn rejected_flag(e: &clap::Error) -> String {
    match e.get(clap::error::ContextKind::InvalidArg) {
        Some(clap::error::ContextValue::String(s)) => {
            match s.trim_start_matches('-').split([' ', '=']).next() {
                Some("X") => LIBRDKAFKA_TABLE.to_owned(),
                other => other.unwrap_or_default().to_owned(),
            }
        }
        _ => "?".to_owned(),
    }
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or(s);
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    text.parse::<toml::Table>().map_err(|e| ConfigError::Toml {
        path: path.to_owned(),
        message: e.message().to_owned(),
    })
}

/// Long names a file may use: the flags of every subcommand, except `config` itself.
fn known_keys(cmd: &clap::Command) -> BTreeSet<String> {
    let mut keys: BTreeSet<String> = cmd
        .get_subcommands()
        .flat_map(|s| s.get_arguments())
        .filter_map(|a| a.get_long())
        .filter(|l| !matches!(*l, "config" | "help" | "version" | "print-config"))
        .map(str::to_owned)
        .collect();
    keys.insert(LIBRDKAFKA_TABLE.to_owned());
    keys
}

fn check_keys(cmd: &clap::Command, path: &Path, table: &toml::Table) -> Result<(), ConfigError> {
    let known = known_keys(cmd);
    match table.keys().find(|k| !known.contains(*k)) {
        None => Ok(()),
        Some(key) => Err(ConfigError::UnknownKey {
            path: path.to_owned(),
            key: key.clone(),
            known: known.into_iter().collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The flags the file contributes to subcommand `sub`: only those the command line and the
/// environment left at their default.
fn file_args(
    sub: &clap::Command,
    matches: &ArgMatches,
    path: &Path,
    table: &toml::Table,
    injected: &mut BTreeSet<String>,
) -> Result<Vec<OsString>, ConfigError> {
    let bad = |key: &str, message: String| ConfigError::Value {
        path: path.to_owned(),
        key: key.to_owned(),
        message,
    };
    let mut out = Vec::new();
    for (key, value) in table {
        if key == LIBRDKAFKA_TABLE {
            if let Some(arg) = sub.get_arguments().find(|a| a.get_short() == Some('X')) {
                out.extend(properties(value).map_err(|m| bad(key, m))?);
                let id = arg.get_id().as_str();
                if matches.value_source(id) != Some(ValueSource::CommandLine) {
                    injected.insert(id.to_owned());
                }
            }
            continue;
        }
        let Some(arg) = sub.get_arguments().find(|a| a.get_long() == Some(key)) else {
            continue; // a flag of another subcommand
        };
        let id = arg.get_id().as_str();
        if matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let flag = format!("--{key}");
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            match value.as_bool() {
                Some(true) => out.push(flag.into()),
                Some(false) => {}
                None => return Err(bad(key, "expected true or false".to_owned())),
            }
        } else if let (ArgAction::Append, toml::Value::Array(items)) = (arg.get_action(), value) {
            // A repeatable flag takes an array: one flag per item (`topic = ["a", "b"]`).
            for item in items {
                out.push(flag.clone().into());
                out.push(scalar(item).map_err(|m| bad(key, m))?.into());
            }
        } else {
            out.push(flag.into());
            out.push(scalar(value).map_err(|m| bad(key, m))?.into());
        }
        injected.insert(id.to_owned());
    }
    Ok(out)
}

fn scalar(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        other => Err(format!(
            "expected a string, number or boolean, got: {}",
            other.type_str()
        )),
    }
}

fn properties(value: &toml::Value) -> Result<Vec<OsString>, String> {
    let table = value
        .as_table()
        .ok_or("expected a table of librdkafka properties")?;
    let mut out = Vec::new();
    for (k, v) in table {
        out.push("-X".into());
        out.push(format!("{k}={}", scalar(v)?).into());
    }
    Ok(out)
}

/// Every setting of the parsed subcommand with its value and source.
fn describe(
    cmd: &clap::Command,
    matches: &ArgMatches,
    injected: &BTreeSet<String>,
) -> Vec<(String, String, Source)> {
    let Some((_, sub)) = matches.subcommand() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "print_config" {
            continue;
        }
        let (Some(source), Ok(Some(raw))) = (sub.value_source(id), sub.try_get_raw(id)) else {
            continue;
        };
        let source = match source {
            ValueSource::CommandLine if injected.contains(id) => Source::File,
            ValueSource::CommandLine => Source::Flag,
            ValueSource::EnvVariable => Source::Env,
            _ => Source::Default,
        };
        let name = arg
            .get_long()
            .map_or_else(|| arg.get_short().unwrap_or('?').to_string(), str::to_owned);
        let values: Vec<String> = raw.map(|v| redact(arg, &v.to_string_lossy())).collect();
        out.push((name, values.join(" "), source));
    }
    out
}

/// A setting's text as `--print-config` shows it, secrets hidden (see module `secret`): the
/// password of the database URL in any form, the value of a sensitive `-X` property, the whole
/// value of any other flag whose environment value `--help` hides, and the password of any URL.
pub fn redact(arg: &clap::Arg, value: &str) -> String {
    if batch_inbox::NatsUrl::is_nats(value) {
        // A NATS URL's user part may be a token: hidden whole.
        batch_inbox::NatsUrl::new(value).redacted()
    } else if arg.get_id() == "database_url"
        || (value.contains("://") && !arg.is_hide_env_values_set())
    {
        redact_database_url(value)
    } else if arg.get_short() == Some('X') {
        redact_property_arg(value)
    } else if arg.is_hide_env_values_set() {
        MASK.to_owned()
    } else {
        value.to_owned()
    }
}

#[cfg(test)]
mod tests;

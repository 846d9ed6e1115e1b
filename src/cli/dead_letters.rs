//! The flags of `dead-letters list` and `dead-letters redrive`, and their validation into the
//! library's [`ListFilter`] and [`Selection`].
//!
//! Invariant: a filter never comes from the environment: `--reason`, `--topic` and `--id` are
//! flags only, so a redrive selects exactly what its command line says. The database and the
//! handler are chosen as for `run` ([`super::DbArgs`], [`super::HandlerArgs`]).

use std::num::NonZeroUsize;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::args::{DbArgs, IdArgs};
use super::handler::HandlerArgs;
use super::retention::parse_retention;
use batch_inbox::redrive::{ListFilter, Selection, DEFAULT_BATCH_SIZE};
use batch_inbox::Decoding;

/// `dead-letters` subcommands.
#[derive(Debug, Args)]
pub struct DeadLettersArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: DeadLettersCommand,
}

/// What to do with dead letters.
#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// Show dead letters: position, id, reason, detail, when written, and their redrive state.
    List(ListArgs),
    /// Apply parked dead letters through the handler, exactly once, and mark each one (never
    /// deleted). By default every parked one but decoding failures and outside_dedup_window.
    Redrive(Box<RedriveArgs>),
}

/// `dead-letters list` flags.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: DbArgs,
    /// Only this reason (repeatable), as stored: invalid_payload, handler_error,
    /// insufficient_funds…
    #[arg(long = "reason", value_name = "REASON")]
    pub reasons: Vec<String>,
    /// Only this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only those written this recently: 1h, 30m, 7d.
    #[arg(long, value_parser = parse_retention)]
    pub since: Option<Duration>,
    /// At most this many, in position order.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(i64).range(1..))]
    pub limit: i64,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl ListArgs {
    /// The library's filter.
    pub fn filter(&self) -> ListFilter {
        ListFilter {
            reasons: self.reasons.clone(),
            topic: self.topic.clone(),
            since: self.since,
            limit: self.limit,
        }
    }
}

/// `dead-letters redrive` flags.
#[derive(Debug, Clone, Args)]
pub struct RedriveArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: DbArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub handler: HandlerArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ids: IdArgs,
    /// Only this reason (repeatable). The decoding failures (missing_id, invalid_id,
    /// empty_payload, invalid_payload) and outside_dedup_window are selected only this way.
    #[arg(long = "reason", value_name = "REASON")]
    pub reasons: Vec<String>,
    /// Only this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this id, as stored in the dead letter (repeatable; any text, not only UUIDs).
    #[arg(long = "id", value_name = "ID")]
    pub id_filter: Vec<String>,
    /// Dead letters per transaction.
    #[arg(long, default_value_t = NonZeroUsize::new(DEFAULT_BATCH_SIZE).expect("not zero"))]
    pub batch_size: NonZeroUsize,
    /// Print what would be selected, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl RedriveArgs {
    /// The library's selection.
    pub fn selection(&self) -> Selection {
        let mut decoding = Decoding::with_ids(self.ids.rules());
        (decoding.tombstones, decoding.values) = self.handler.reading();
        Selection {
            reasons: self.reasons.clone(),
            topic: self.topic.clone(),
            ids: self.id_filter.clone(),
            decoding,
            batch_size: self.batch_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::commands::{Cli, Command};
    use crate::cli::handler::HandlerKind;

    fn redrive(args: &[&str]) -> Result<RedriveArgs, clap::Error> {
        let all = ["batch-inbox", "dead-letters", "redrive"];
        let cli = Cli::try_parse_from(all.iter().chain(args))?;
        match cli.command {
            Command::DeadLetters(d) => match d.command {
                DeadLettersCommand::Redrive(r) => Ok(*r),
                DeadLettersCommand::List(_) => panic!("not redrive"),
            },
            _ => panic!("not dead-letters"),
        }
    }

    #[test]
    fn redrive_takes_run_s_handler_flags_and_repeatable_filters() {
        let r = redrive(&[
            "--handler",
            "sql",
            "--apply-sql",
            "x.sql",
            "--id",
            "a",
            "--id",
            "b",
        ])
        .unwrap();
        assert_eq!(r.handler.kind, HandlerKind::Sql);
        assert_eq!(r.handler.check(), Ok(()));
        let s = r.selection();
        assert_eq!(s.ids, ["a", "b"]);
        assert!(s.reasons.is_empty() && s.topic.is_none());
        assert_eq!(s.batch_size.get(), 500);
        let err = redrive(&["--handler", "sql"]).unwrap_err().to_string();
        assert!(err.contains("--apply-sql"), "{err}");
        let stray = redrive(&["--apply-sql", "x.sql"]).unwrap();
        assert!(stray.handler.check().unwrap_err().contains("--handler sql"));
        let err = redrive(&["--batch-size", "0"]).unwrap_err().to_string();
        assert!(err.contains("--batch-size"), "{err}");
    }

    #[test]
    fn list_parses_its_window() {
        let cli =
            Cli::try_parse_from(["batch-inbox", "dead-letters", "list", "--since", "1h"]).unwrap();
        let Command::DeadLetters(d) = cli.command else {
            panic!("not dead-letters")
        };
        let DeadLettersCommand::List(l) = d.command else {
            panic!("not list")
        };
        assert_eq!(l.filter().since, Some(Duration::from_secs(3600)));
        assert!(!l.json);
    }
}

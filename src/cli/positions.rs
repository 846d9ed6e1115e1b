//! The flags of `positions set`: where to move a consumer group's positions in the database,
//! and why.
//!
//! Invariant: a target and a reason are flags only, never from the environment or a settings
//! file's defaults, so a move does exactly what its command line says.

use clap::{ArgGroup, Args, Subcommand};

use super::args::{DbArgs, KafkaArgs};
use batch_inbox::internals::defaults;
use batch_inbox::positions::PositionTarget;
use batch_inbox::KafkaSettings;

/// `positions` subcommands.
#[derive(Debug, Args)]
pub struct PositionsArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: PositionsCommand,
}

/// What to do with a group's positions.
#[derive(Debug, Subcommand)]
pub enum PositionsCommand {
    /// Move a group's positions in the database (a skip, a rewind, or a loss accepted), each
    /// move recorded in consumer_offset_changes; running processors follow within seconds.
    Set(Box<SetArgs>),
}

/// `positions set` flags.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["to_offset", "to_earliest", "to_latest", "to_time"])))]
pub struct SetArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub db: DbArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub kafka: KafkaArgs,
    /// Consumer group whose positions move.
    #[arg(long, env = "BATCH_INBOX_GROUP", default_value = defaults::GROUP)]
    pub group: String,
    /// Only this partition (repeatable); every partition of the topic by default.
    #[arg(long = "partition", value_name = "PARTITION")]
    pub partitions: Vec<i32>,
    /// To this offset of each partition (inside its log).
    #[arg(long)]
    pub to_offset: Option<i64>,
    /// To the first record each partition still holds.
    #[arg(long)]
    pub to_earliest: bool,
    /// To the end of each partition (everything before it skipped).
    #[arg(long)]
    pub to_latest: bool,
    /// To the first record at or after this time, in Unix milliseconds (the records'
    /// timestamps); the end where there is none.
    #[arg(long, value_name = "UNIX_MS")]
    pub to_time: Option<i64>,
    /// Why, recorded with each move (who asked, the incident).
    #[arg(long)]
    pub reason: String,
    /// Show the moves without making them.
    #[arg(long)]
    pub dry_run: bool,
}

impl SetArgs {
    /// The target the flags name (clap makes exactly one of them present).
    pub fn target(&self) -> PositionTarget {
        match (self.to_offset, self.to_time, self.to_earliest) {
            (Some(o), _, _) => PositionTarget::Offset(o),
            (_, Some(ms), _) => PositionTarget::Time(ms),
            (_, _, true) => PositionTarget::Earliest,
            _ => PositionTarget::Latest,
        }
    }

    /// The Kafka connection (the group's, which is never joined).
    pub fn kafka(&self) -> KafkaSettings {
        let mut kafka = KafkaSettings::new(&self.kafka.brokers, self.kafka.topic(), &self.group);
        kafka.overrides = self.kafka.properties.clone();
        kafka
    }
}

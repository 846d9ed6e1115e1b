//! The comparison with the peers (`scripts/peers/compare.sh`, `scripts/peers/outbox.sh`): the
//! `peers` subcommand. [`row`]: one run's result row; [`model`]: the generator's model as the
//! comparison uses it (its counts, the two topics' models compared, a map as `\copy` rows);
//! [`table`]: the comparison's results (`results.md`, `machine.json`); [`outbox`]: the outbox
//! run's results.

pub mod model;
pub mod outbox;
pub mod row;
pub mod table;

use std::path::PathBuf;

use anyhow::Result;

/// `peers` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PeersArgs {
    #[command(subcommand)]
    #[allow(missing_docs)]
    pub command: PeersCommand,
}

/// `peers` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PeersCommand {
    /// Append one result row of compare.sh (rate and CPU per 1000 records).
    Row(row::RowArgs),
    /// Print the model's `NEW DUPLICATES CUSTOMERS ACCOUNTS`: new records, duplicates,
    /// customers with a last new record, accounts with a sum.
    Model {
        /// The model (`produce --expect`).
        #[arg(long)]
        expect: PathBuf,
    },
    /// Fail unless two models of the same entries agree (records, new, duplicates, dead
    /// letters, balances, sums).
    SameModel {
        /// One topic's model.
        a: PathBuf,
        /// The other's.
        b: PathBuf,
    },
    /// Print a map of the model as `KEY<TAB>VALUE` lines (for psql's \copy).
    ModelRows {
        /// The model (`produce --expect`).
        #[arg(long)]
        expect: PathBuf,
        /// The map.
        #[arg(value_enum)]
        field: model::Field,
    },
    /// Write compare.sh's results (rows.jsonl, machine.json, results.md) and print the table.
    Table(table::TableArgs),
    /// Write outbox.sh's results (outbox.json, outbox.md) and print the JSON.
    OutboxReport(outbox::OutboxArgs),
}

/// Runs a `peers` subcommand.
pub async fn run(args: PeersArgs) -> Result<()> {
    let read = crate::verify::read_expected;
    match args.command {
        PeersCommand::Row(a) => row::append(&a),
        PeersCommand::Model { expect } => {
            println!("{}", model::counts(&read(&expect)?));
            Ok(())
        }
        PeersCommand::SameModel { a, b } => model::same(&read(&a)?, &read(&b)?),
        PeersCommand::ModelRows { expect, field } => {
            print!("{}", model::rows(&read(&expect)?, field));
            Ok(())
        }
        PeersCommand::Table(a) => table::run(&a).await,
        PeersCommand::OutboxReport(a) => outbox::run(&a),
    }
}

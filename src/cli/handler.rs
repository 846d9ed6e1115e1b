//! Which handler applies the new messages (`run`, `migrate`, `dead-letters redrive`): the
//! reference ledger, or one SQL statement from a file.

use clap::Args;

/// The handler: what applies the new messages (`run`, `dead-letters redrive`).
#[derive(Debug, Clone, Args)]
pub struct HandlerArgs {
    /// What applies the new messages: `ledger` (the reference account ledger) or `sql` (the
    /// statement of --apply-sql).
    #[arg(
        id = "handler",
        long = "handler",
        env = "BATCH_INBOX_HANDLER",
        value_enum,
        default_value_t = HandlerKind::Ledger
    )]
    pub kind: HandlerKind,
    /// With --handler sql: a file holding one SQL statement, run once per batch in the batch's
    /// transaction with $1 = its new messages as a jsonb array (docs/SQL-HANDLER.md).
    #[arg(
        long,
        env = "BATCH_INBOX_APPLY_SQL",
        value_name = "FILE",
        required_if_eq("handler", "sql")
    )]
    pub apply_sql: Option<std::path::PathBuf>,
}

impl HandlerArgs {
    /// Refuses a statement file without the SQL handler (it would be silently unused).
    pub fn check(&self) -> Result<(), String> {
        match (self.kind, &self.apply_sql) {
            (HandlerKind::Ledger, Some(_)) => {
                Err("--apply-sql is the SQL handler's statement: add --handler sql".to_owned())
            }
            _ => Ok(()),
        }
    }
}

/// The handler of `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HandlerKind {
    /// The reference handler: account balances that never go below zero.
    #[default]
    Ledger,
    /// One SQL statement per batch, from --apply-sql.
    Sql,
}

//! The SQL handler: an exactly-once Kafka → PostgreSQL sink without Rust code. One SQL statement,
//! read from a file once, runs once per batch inside the batch's transaction, after the dedup,
//! with `$1` = the batch's new messages as a `jsonb` array in partition order (module `input`).
//! Rows it returns with `message_id` and `reason` columns dead-letter those messages (module
//! `rejections`). docs/SQL-HANDLER.md is the user's guide.
//!
//! Invariants: the statement is prepared and checked before anything is consumed
//! ([`SqlHandler::prepare`]): it must prepare and take exactly one parameter, `$1 jsonb`. It runs
//! as a prepared statement only, never with text put into it. Its errors are the handler's
//! ([`HandlerError::Db`]): transient ones are retried, any other bisects the batch down to the
//! message it fails on.

use std::path::{Path, PathBuf};

use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::types::Type;

use crate::db::Transaction;
use crate::error::HandlerError;
use crate::handler::{Handler, Rejection};
use crate::message::Message;

mod input;
mod rejections;

pub use input::JsonPayload;
use input::{input_array, Jsonb};
use rejections::{rejections, RejectionColumns};

/// The handler that runs one SQL statement per batch (see the module documentation).
#[derive(Debug, Clone)]
pub struct SqlHandler {
    sql: String,
    rejections: Option<RejectionColumns>,
}

/// Why a statement cannot be the SQL handler's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqlError {
    /// The file cannot be read.
    #[error("cannot read the file: {0}")]
    Read(#[from] std::io::Error),
    /// The text holds no statement (only blanks and comments).
    #[error("the file holds no SQL statement")]
    Empty,
    /// No connection to prepare it on.
    #[error("no database connection to prepare the statement: {}", crate::error::pool_line(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    /// PostgreSQL refused to prepare it (its message, on one line).
    #[error("the statement does not prepare: {0}")]
    Prepare(String),
    /// Its parameters are not exactly one `jsonb`.
    #[error("the statement must take exactly one parameter, $1 of type jsonb; it takes {0}")]
    Parameters(String),
    /// It returns `message_id` and `reason` columns of types that cannot name rejections.
    #[error("{0}")]
    Result(String),
}

/// A statement file that cannot be the SQL handler's: the file and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct SqlFileError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub source: SqlError,
}

impl SqlHandler {
    /// Reads the statement in `path` and prepares it ([`SqlHandler::prepare`]).
    pub async fn from_file(pool: &Pool, path: &Path) -> Result<Self, SqlFileError> {
        let at = |source| SqlFileError {
            path: path.to_owned(),
            source,
        };
        let sql = std::fs::read_to_string(path).map_err(|e| at(SqlError::Read(e)))?;
        Self::prepare(pool, sql).await.map_err(at)
    }

    /// Prepares `sql` once on a connection of `pool` and checks it: it must prepare (one
    /// statement) and take exactly one parameter, `$1 jsonb`; when its result has `message_id`
    /// and `reason` columns, they must be uuid or text, and text.
    pub async fn prepare(pool: &Pool, sql: String) -> Result<Self, SqlError> {
        if is_blank(&sql) {
            return Err(SqlError::Empty);
        }
        let client = pool.get().await?;
        let stmt = client
            .prepare(&sql)
            .await
            .map_err(|e| SqlError::Prepare(one_line(&e)))?;
        if stmt.params() != [Type::JSONB] {
            return Err(SqlError::Parameters(describe_params(stmt.params())));
        }
        let rejections = RejectionColumns::of(stmt.columns()).map_err(SqlError::Result)?;
        Ok(Self { sql, rejections })
    }

    /// Runs the statement on an empty batch (`$1` is `[]`) in a transaction that is rolled back:
    /// a privilege its role lacks fails here, before anything is consumed
    /// ([`DbError::Denied`](crate::error::DbError::Denied)), not on the first batch. `command` names
    /// the command that needs it, for the message.
    pub async fn check_grants(
        &self,
        pool: &Pool,
        command: &str,
    ) -> Result<(), crate::error::DbError> {
        crate::db::check_statement(pool, command, "the SQL handler's statement", &self.sql).await
    }

    /// Whether the statement's result names rejections (`message_id` and `reason` columns).
    pub fn returns_rejections(&self) -> bool {
        self.rejections.is_some()
    }
}

impl Handler for SqlHandler {
    type Payload = JsonPayload;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<JsonPayload>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let input = input_array(messages);
        let stmt = tx.prepare_cached(&self.sql).await?;
        let rows = tx.query(&stmt, &[&Jsonb(&input)]).await?;
        // The prepared result's shape, not the start-up one: the schema may have changed since.
        let Some(columns) =
            RejectionColumns::of(stmt.columns()).map_err(|e| HandlerError::Other(e.into()))?
        else {
            return Ok(Vec::new());
        };
        rejections(columns, &rows, messages).map_err(|e| HandlerError::Other(Box::new(e)))
    }
}

/// PostgreSQL's error on one line: `ERROR: message`, and its hint when there is one.
fn one_line(e: &tokio_postgres::Error) -> String {
    let text = match e.as_db_error() {
        Some(db) => match db.hint() {
            Some(hint) => format!("{}: {} (hint: {hint})", db.severity(), db.message()),
            None => format!("{}: {}", db.severity(), db.message()),
        },
        None => e.to_string(),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn describe_params(params: &[Type]) -> String {
    if params.is_empty() {
        return "none".to_owned();
    }
    let each: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(i, t)| format!("${} {t}", i + 1))
        .collect();
    each.join(", ")
}

/// True when `sql` holds only whitespace and comments (`-- …` lines, nested `/* … */`).
fn is_blank(sql: &str) -> bool {
    let mut rest = sql.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix("--") {
            rest = after.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if rest.starts_with("/*") {
            let mut depth = 0usize;
            let mut end = None;
            let bytes = rest.as_bytes();
            let mut i = 0;
            while i + 1 < bytes.len() {
                match (bytes[i], bytes[i + 1]) {
                    (b'/', b'*') => {
                        depth += 1;
                        i += 2;
                    }
                    (b'*', b'/') => {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            end = Some(i);
                            break;
                        }
                    }
                    _ => i += 1,
                }
            }
            match end {
                // An unterminated comment is PostgreSQL's to refuse.
                None => return false,
                Some(i) => rest = rest[i..].trim_start(),
            }
        } else {
            return rest.is_empty();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_means_only_whitespace_and_comments() {
        for blank in ["", " \n\t", "-- x\n", "-- x", "/* a /* b */ c */ -- d\n  "] {
            assert!(is_blank(blank), "{blank:?}");
        }
        for not in [
            "SELECT 1",
            "-- x\nSELECT $1",
            "/* a */ ;",
            "/* open",
            "/* a /* b */",
        ] {
            assert!(!is_blank(not), "{not:?}");
        }
    }

    #[test]
    fn parameters_are_listed() {
        assert_eq!(describe_params(&[]), "none");
        assert_eq!(
            describe_params(&[Type::JSONB, Type::INT4]),
            "$1 jsonb, $2 int4"
        );
    }
}

//! The SQL handler: an exactly-once Kafka → PostgreSQL sink without Rust code. One SQL statement
//! per topic (or one for every topic), read from a file once, runs once per batch inside the
//! batch's transaction, after the dedup, with `$1` = the batch's new messages of that topic as a
//! `jsonb` array in partition order (module `input`). Rows it returns with `message_id` and
//! `reason` columns dead-letter those messages (module `rejections`). docs/SQL-HANDLER.md is the
//! user's guide.
//!
//! Invariants: the statement is prepared and checked before anything is consumed
//! ([`SqlHandler::prepare`]): it must prepare and take exactly one parameter, `$1 jsonb`. It runs
//! as a prepared statement only, never with text put into it. Its errors are the handler's
//! ([`HandlerError::Db`]): transient ones are retried, any other bisects the batch down to the
//! message it fails on. A batch holds one partition's records, so one topic's; a re-drive's may
//! hold several, and each topic's messages then go to that topic's statement, in order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::types::Type;

use crate::db::Transaction;
use crate::error::HandlerError;
use crate::pipeline::handler::{Handler, Rejection};
use crate::pipeline::message::Message;
use crate::reason::Reason;

mod input;
mod rejections;
mod typed;

pub use input::JsonPayload;
use input::{input_array, Jsonb};
use rejections::{rejections, RejectionColumns};
use typed::{Declarations, Envelope};

/// One statement of the SQL handler, read, prepared and checked.
#[derive(Debug, Clone)]
pub struct SqlStatement {
    sql: String,
    rejections: Option<RejectionColumns>,
    /// Its file's declarations: typed parameters (none: the `jsonb` form) and an envelope.
    declared: Declarations,
}

/// The handler that runs one SQL statement per batch (see the module documentation): the
/// statement of the batch's topic, or the one for every other topic.
#[derive(Debug, Clone)]
pub struct SqlHandler {
    by_topic: HashMap<String, SqlStatement>,
    fallback: Option<SqlStatement>,
}

/// A topic and the statements of a [`SqlHandler`] that do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// A consumed topic has no statement (and there is none for every topic).
    #[error(
        "topic {0:?} has no statement: give it one (--apply-sql {0}=FILE) or give one for every \
         topic (--apply-sql FILE)"
    )]
    NoStatement(String),
    /// A statement names a topic that is not consumed: a typo would leave it unused.
    #[error("--apply-sql names topic {0:?}, which is not consumed (--topic)")]
    NotConsumed(String),
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
    #[error("no database connection to prepare the statement: {}", crate::one_line::pool_line(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    /// PostgreSQL refused to prepare it (its message, on one line).
    #[error("the statement does not prepare: {0}")]
    Prepare(String),
    /// Its parameters are not exactly one `jsonb`.
    #[error("the statement must take exactly one parameter, $1 of type jsonb; it takes {0}")]
    Parameters(String),
    /// Its declarations (`-- batch-inbox: …` lines) are malformed or do not fit its parameters.
    #[error("{0}")]
    Declaration(String),
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

impl SqlStatement {
    /// Reads the statement in `path` and prepares it ([`SqlStatement::prepare`]).
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
        let declared = typed::declarations(&sql).map_err(SqlError::Declaration)?;
        let client = pool.get().await?;
        let stmt = client
            .prepare(&sql)
            .await
            .map_err(|e| SqlError::Prepare(one_line(&e)))?;
        if declared.fields.is_empty() {
            if stmt.params() != [Type::JSONB] {
                return Err(SqlError::Parameters(describe_params(stmt.params())));
            }
        } else {
            typed::elements(&declared.fields, stmt.params()).map_err(SqlError::Declaration)?;
        }
        let rejections = RejectionColumns::of(stmt.columns()).map_err(SqlError::Result)?;
        Ok(Self {
            sql,
            rejections,
            declared,
        })
    }

    /// Runs the statement on an empty batch (`$1` is `[]`) in a transaction that is rolled back:
    /// a privilege its role lacks fails here, before anything is consumed
    /// ([`DbError::Denied`](crate::db::DbError::Denied)), not on the first batch. `command` names
    /// the command that needs it, for the message.
    pub async fn check_grants(&self, pool: &Pool, command: &str) -> Result<(), crate::db::DbError> {
        crate::db::check_statement(pool, command, "the SQL handler's statement", &self.sql).await
    }

    /// Whether the statement's result names rejections (`message_id` and `reason` columns).
    pub fn returns_rejections(&self) -> bool {
        self.rejections.is_some()
    }

    /// Whether its file reads the values as JSON (fields `value /POINTER`, `envelope =
    /// connect`): it needs `--value-format json`.
    pub fn reads_json(&self) -> bool {
        self.declared.reads_json()
    }

    /// Runs the statement on `messages` (one topic's, in order); rejections by index in them.
    /// A message whose declared fields or envelope do not fit is refused before it runs, and
    /// never reaches it; a batch with no message left does not run it.
    async fn run(
        &self,
        tx: &Transaction<'_>,
        messages: &[&Message<JsonPayload>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        let stmt = tx.prepare_cached(&self.sql).await?;
        let fields = &self.declared.fields;
        let envelope = self.declared.envelope;
        let (rows, kept, mut refused) = if !fields.is_empty() {
            // The prepared statement's types, not the start-up ones: a type inferred from a
            // column may have changed since; that is the schema's fault, not a message's.
            let elements = typed::elements(fields, stmt.params())
                .map_err(|e| HandlerError::Environment(e.into()))?;
            let input = typed::input(fields, &elements, envelope, messages);
            let rows = match input.kept.is_empty() {
                true => Vec::new(),
                false => tx.query(&stmt, &input.params()).await?,
            };
            (rows, input.kept, input.refused)
        } else if envelope == Envelope::None {
            let rows = tx
                .query(&stmt, &[&Jsonb(&input_array(messages, None))])
                .await?;
            (rows, (0..messages.len()).collect(), Vec::new())
        } else {
            let (mut kept, mut refused, mut values) = (Vec::new(), Vec::new(), Vec::new());
            for (i, m) in messages.iter().enumerate() {
                match typed::unwrap(envelope, &m.payload) {
                    Ok(data) => {
                        kept.push(i);
                        values.push(data.map_or_else(
                            || String::from_utf8_lossy(m.payload.as_bytes()).into_owned(),
                            str::to_owned,
                        ));
                    }
                    Err(detail) => refused.push(Rejection::new(i, Reason::InvalidPayload, detail)),
                }
            }
            let part: Vec<&Message<JsonPayload>> = kept.iter().map(|&i| messages[i]).collect();
            let rows = match part.is_empty() {
                true => Vec::new(),
                false => {
                    let input = input_array(&part, Some(&values));
                    tx.query(&stmt, &[&Jsonb(&input)]).await?
                }
            };
            (rows, kept, refused)
        };
        // The prepared result's shape, not the start-up one: the schema may have changed since.
        let Some(columns) =
            RejectionColumns::of(stmt.columns()).map_err(|e| HandlerError::Other(e.into()))?
        else {
            return Ok(refused);
        };
        let part: Vec<&Message<JsonPayload>> = kept.iter().map(|&i| messages[i]).collect();
        let by_statement =
            rejections(columns, &rows, &part).map_err(|e| HandlerError::Other(Box::new(e)))?;
        if refused.is_empty() && kept.len() == messages.len() {
            return Ok(by_statement);
        }
        refused.extend(by_statement.into_iter().map(|mut r| {
            r.index = kept[r.index];
            r
        }));
        refused.sort_by_key(|r| r.index);
        Ok(refused)
    }
}

impl SqlHandler {
    /// Reads the statement in `path` and prepares it, for every topic
    /// ([`SqlStatement::prepare`]).
    pub async fn from_file(pool: &Pool, path: &Path) -> Result<Self, SqlFileError> {
        SqlStatement::from_file(pool, path)
            .await
            .map(Self::every_topic)
    }

    /// Prepares `sql`, for every topic ([`SqlStatement::prepare`]).
    pub async fn prepare(pool: &Pool, sql: String) -> Result<Self, SqlError> {
        SqlStatement::prepare(pool, sql)
            .await
            .map(Self::every_topic)
    }

    /// One statement for every topic.
    pub fn every_topic(statement: SqlStatement) -> Self {
        Self::routed([], Some(statement))
    }

    /// A statement per topic of `by_topic`, and `fallback` for every other topic (`None`: a
    /// record of another topic stalls its partition, [`SqlHandler::check_topics`] finds that
    /// before anything is consumed). A topic named twice keeps its last statement.
    pub fn routed(
        by_topic: impl IntoIterator<Item = (String, SqlStatement)>,
        fallback: Option<SqlStatement>,
    ) -> Self {
        Self {
            by_topic: by_topic.into_iter().collect(),
            fallback,
        }
    }

    /// The statement that applies `topic`'s records.
    pub fn statement_for(&self, topic: &str) -> Option<&SqlStatement> {
        self.by_topic.get(topic).or(self.fallback.as_ref())
    }

    /// Fails unless every topic of `topics` has a statement and every topic named by a
    /// statement is one of `topics`.
    pub fn check_topics(&self, topics: &[String]) -> Result<(), RouteError> {
        let mut named: Vec<&String> = self.by_topic.keys().collect();
        named.sort();
        if let Some(t) = named.into_iter().find(|t| !topics.contains(t)) {
            return Err(RouteError::NotConsumed(t.clone()));
        }
        match topics.iter().find(|t| self.statement_for(t).is_none()) {
            Some(t) => Err(RouteError::NoStatement(t.clone())),
            None => Ok(()),
        }
    }

    /// [`SqlStatement::check_grants`] of every statement.
    pub async fn check_grants(&self, pool: &Pool, command: &str) -> Result<(), crate::db::DbError> {
        for statement in self.fallback.iter().chain(self.by_topic.values()) {
            statement.check_grants(pool, command).await?;
        }
        Ok(())
    }

    /// Whether a statement's result names rejections (`message_id` and `reason` columns).
    pub fn returns_rejections(&self) -> bool {
        self.fallback
            .iter()
            .chain(self.by_topic.values())
            .any(SqlStatement::returns_rejections)
    }
}

impl Handler for SqlHandler {
    type Payload = JsonPayload;

    fn statements(&self) -> Vec<String> {
        let all = self.fallback.iter().chain(self.by_topic.values());
        all.map(|s| s.sql.clone()).collect()
    }

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<JsonPayload>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        let Some(first) = messages.first() else {
            return Ok(Vec::new());
        };
        // One topic (every batch of a partition): the statement sees the whole slice.
        if messages.iter().all(|m| m.raw.topic == first.raw.topic) {
            let all: Vec<&Message<JsonPayload>> = messages.iter().collect();
            return self.statement(&first.raw.topic)?.run(tx, &all).await;
        }
        // Several (a re-drive): each topic's messages, in order, to its statement.
        let mut topics: Vec<(&str, Vec<usize>)> = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            match topics.iter_mut().find(|(t, _)| *t == &*m.raw.topic) {
                Some((_, indexes)) => indexes.push(i),
                None => topics.push((&m.raw.topic, vec![i])),
            }
        }
        let mut out = Vec::new();
        for (topic, indexes) in topics {
            let part: Vec<&Message<JsonPayload>> = indexes.iter().map(|&i| &messages[i]).collect();
            for mut r in self.statement(topic)?.run(tx, &part).await? {
                r.index = indexes[r.index];
                out.push(r);
            }
        }
        out.sort_by_key(|r| r.index);
        Ok(out)
    }
}

impl SqlHandler {
    fn statement(&self, topic: &str) -> Result<&SqlStatement, HandlerError> {
        self.statement_for(topic)
            .ok_or_else(|| HandlerError::Other(Box::new(RouteError::NoStatement(topic.to_owned()))))
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

//! Which handler applies the new messages (`run`, `migrate`, `dead-letters redrive`): the
//! reference ledger, or SQL statements from files, one per topic or one for every topic; and how
//! the SQL handler reads tombstones and values.

use std::path::PathBuf;

use batch_inbox::{Tombstones, ValueFormat};
use clap::Args;

use super::args::named;

/// The handler: what applies the new messages (`run`, `dead-letters redrive`).
#[derive(Debug, Clone, Args)]
pub struct HandlerArgs {
    /// What applies the new messages: `ledger` (the reference account ledger) or `sql` (the
    /// statements of --apply-sql).
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
    /// `TOPIC=FILE` serves that topic only; a bare FILE every topic without one of its own
    /// (repeatable).
    #[arg(
        long,
        env = "BATCH_INBOX_APPLY_SQL",
        value_name = "[TOPIC=]FILE",
        value_parser = parse_apply_sql,
        required_if_eq("handler", "sql")
    )]
    pub apply_sql: Vec<ApplySql>,
    /// What a tombstone (a record with no value) becomes: `pass` (a message whose element has
    /// "value": null and "tombstone": true; the SQL handler's default) or `dead-letter`
    /// (`empty_payload`; the ledger's, which takes nothing else).
    #[arg(long, env = "BATCH_INBOX_TOMBSTONES", value_parser = named::<Tombstones>())]
    pub tombstones: Option<Tombstones>,
    /// With --handler sql, what a record value is: `json` (a JSON document), `text` (UTF-8,
    /// passed as a JSON string) or `bytes` (passed as {"hex": "…"}).
    #[arg(
        long,
        env = "BATCH_INBOX_VALUE_FORMAT",
        value_parser = named::<ValueFormat>()
    )]
    pub value_format: Option<ValueFormat>,
}

/// One `--apply-sql`: a statement file, for one topic or for every topic without its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplySql {
    /// The topic it serves (`None`: every topic without a statement of its own).
    pub topic: Option<String>,
    /// The statement file.
    pub path: PathBuf,
}

/// `TOPIC=FILE` when the text before the first `=` is a topic name (Kafka's characters only),
/// else a bare FILE (write `./a=b.sql` for a file whose name looks like `TOPIC=…`).
fn parse_apply_sql(s: &str) -> Result<ApplySql, String> {
    let topic_like = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    let (topic, path) = match s.split_once('=') {
        Some((t, path)) if topic_like(t) => (Some(t.to_owned()), path),
        _ => (None, s),
    };
    if path.is_empty() {
        return Err("expected FILE or TOPIC=FILE, with a file name".to_owned());
    }
    Ok(ApplySql {
        topic,
        path: PathBuf::from(path),
    })
}

impl HandlerArgs {
    /// Refuses settings another handler would silently ignore or that break the ledger: a
    /// statement file, tombstones passed on, or a value format other than JSON.
    pub fn check(&self) -> Result<(), String> {
        if self.kind != HandlerKind::Ledger {
            return Ok(());
        }
        if !self.apply_sql.is_empty() {
            return Err("--apply-sql is the SQL handler's statement: add --handler sql".to_owned());
        }
        if self.tombstones == Some(Tombstones::Pass) {
            return Err(
                "--tombstones pass needs --handler sql: the ledger has no meaning for a record \
                 without a value (it dead-letters tombstones as empty_payload)"
                    .to_owned(),
            );
        }
        if self.value_format.is_some_and(|v| v != ValueFormat::Json) {
            return Err("--value-format is the SQL handler's: the ledger reads JSON".to_owned());
        }
        Ok(())
    }

    /// Refuses statements that do not fit `topics` (the consumed ones): a topic with no
    /// statement, a statement for a topic not consumed, two statements for one topic or two for
    /// every topic.
    pub fn check_routes(&self, topics: &[String]) -> Result<(), String> {
        if self.kind != HandlerKind::Sql {
            return Ok(());
        }
        let mut seen: Vec<Option<&str>> = Vec::new();
        for a in &self.apply_sql {
            let topic = a.topic.as_deref();
            if seen.contains(&topic) {
                return Err(match topic {
                    Some(t) => format!("--apply-sql gives topic {t:?} two statements"),
                    None => "--apply-sql gives two statements for every topic (FILE without \
                             TOPIC=)"
                        .to_owned(),
                });
            }
            seen.push(topic);
            if let Some(t) = topic.filter(|t| !topics.iter().any(|c| c == t)) {
                return Err(format!(
                    "--apply-sql names topic {t:?}, which is not consumed (--topic {})",
                    topics.join(",")
                ));
            }
        }
        if seen.contains(&None) {
            return Ok(());
        }
        match topics.iter().find(|t| !seen.contains(&Some(t.as_str()))) {
            Some(t) => Err(format!(
                "topic {t:?} has no statement: add --apply-sql {t}=FILE, or a bare --apply-sql \
                 FILE for every topic without one"
            )),
            None => Ok(()),
        }
    }

    /// How records are read for this handler: (tombstones, values), each the flag's or the
    /// handler's default (the SQL handler passes tombstones on, the ledger dead-letters them).
    pub fn reading(&self) -> (Tombstones, ValueFormat) {
        let tombstones = self.tombstones.unwrap_or(match self.kind {
            HandlerKind::Sql => Tombstones::Pass,
            HandlerKind::Ledger => Tombstones::DeadLetter,
        });
        (tombstones, self.value_format.unwrap_or_default())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(apply: &[&str]) -> HandlerArgs {
        HandlerArgs {
            kind: HandlerKind::Sql,
            apply_sql: apply.iter().map(|a| parse_apply_sql(a).unwrap()).collect(),
            tombstones: None,
            value_format: None,
        }
    }

    fn topics(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn apply_sql_is_a_file_or_a_topic_and_a_file() {
        let at = |s| parse_apply_sql(s).unwrap();
        assert_eq!(at("a.sql").topic, None);
        assert_eq!(at("orders=sql/o.sql").topic.as_deref(), Some("orders"));
        assert_eq!(at("orders=sql/o.sql").path, PathBuf::from("sql/o.sql"));
        assert_eq!(at("./x=y.sql").topic, None, "a path, not a topic");
        assert_eq!(at("/tmp/x=y.sql").path, PathBuf::from("/tmp/x=y.sql"));
        assert!(parse_apply_sql("orders=").is_err());
        assert!(parse_apply_sql("").is_err());
    }

    #[test]
    fn every_consumed_topic_needs_exactly_one_statement() {
        let two = topics(&["a", "b"]);
        assert_eq!(sql(&["a=x.sql", "b=y.sql"]).check_routes(&two), Ok(()));
        assert_eq!(sql(&["a=x.sql", "z.sql"]).check_routes(&two), Ok(()));
        assert_eq!(sql(&["z.sql"]).check_routes(&two), Ok(()));
        let missing = sql(&["a=x.sql"]).check_routes(&two).unwrap_err();
        assert!(
            missing.contains("topic \"b\" has no statement"),
            "{missing}"
        );
        let unknown = sql(&["a=x.sql", "c=y.sql", "z.sql"])
            .check_routes(&two)
            .unwrap_err();
        assert!(
            unknown.contains("\"c\", which is not consumed"),
            "{unknown}"
        );
        let twice = sql(&["a=x.sql", "a=y.sql", "z.sql"])
            .check_routes(&two)
            .unwrap_err();
        assert!(twice.contains("two statements"), "{twice}");
        assert!(sql(&["x.sql", "y.sql"]).check_routes(&two).is_err());
    }

    #[test]
    fn the_ledger_takes_no_tombstones_and_json_only() {
        let mut ledger = sql(&[]);
        ledger.kind = HandlerKind::Ledger;
        assert_eq!(ledger.check(), Ok(()));
        assert_eq!(
            ledger.reading(),
            (Tombstones::DeadLetter, ValueFormat::Json)
        );
        ledger.tombstones = Some(Tombstones::Pass);
        assert!(ledger.check().unwrap_err().contains("--tombstones pass"));
        ledger.tombstones = Some(Tombstones::DeadLetter);
        ledger.value_format = Some(ValueFormat::Text);
        assert!(ledger.check().unwrap_err().contains("--value-format"));
        assert_eq!(sql(&["x.sql"]).reading().0, Tombstones::Pass);
    }
}

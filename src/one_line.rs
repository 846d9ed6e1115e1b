//! An error said on one line, each cause once: how the binary prints an error
//! ([`crate::error::one_line_error`]) and how the errors and logs of every stage say a
//! PostgreSQL or pool failure (the server's message with its detail and hint, not the driver's
//! `db error: ERROR: …` on several lines).
//!
//! A leaf: the database's errors (`db`) are said by it as well as the pipeline's (`error`).

use deadpool_postgres::PoolError;

/// An error with its causes, each once, on one line: a wrapper that displays its cause is not
/// repeated, and a PostgreSQL or pool error is said the way [`pg_line`] and [`pool_line`] say
/// it (the driver's own words, `db error`, and the server's multi-line text are not).
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    let mut node = Some(error);
    while let Some(e) = node {
        let (own, next) = match (
            e.downcast_ref::<tokio_postgres::Error>(),
            e.downcast_ref::<PoolError>(),
        ) {
            (Some(pg), _) => (pg_line(pg), None),
            (None, Some(pool)) => (pool_line(pool), None),
            (None, None) => (one_line(&e.to_string()), e.source()),
        };
        if text.is_empty() {
            text = own;
        } else if !own.is_empty() && !text.ends_with(&own) {
            text.push_str(": ");
            text.push_str(&own);
        }
        node = next;
    }
    text
}

/// `text` on one line: its line breaks and runs of blanks become one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A PostgreSQL error on one line, as a person would say it: the server's message, with its
/// detail and hint (`permission denied for table inbox`); for a failure on the client's side,
/// the driver's words and their cause once (`error connecting to server: Connection refused (os
/// error 111)`).
pub(crate) fn pg_line(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = db.message().to_owned();
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" (detail: {detail})"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!(" (hint: {hint})"));
        }
        return one_line(&text);
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.ends_with(&c_text) {
            text.push_str(": ");
            text.push_str(&c_text);
        }
        cause = c.source();
    }
    one_line(&text)
}

/// A pool's failure on one line: the database's error behind it ([`pg_line`]), or what the pool
/// waited for.
pub(crate) fn pool_line(e: &PoolError) -> String {
    use deadpool_postgres::HookError;
    match e {
        PoolError::Backend(e) | PoolError::PostCreateHook(HookError::Backend(e)) => pg_line(e),
        PoolError::PostCreateHook(HookError::Message(m)) => one_line(m),
        other => other.to_string(),
    }
}

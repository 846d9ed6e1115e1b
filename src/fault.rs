//! Who owns a database failure: retrying fixes it (transient), the environment must change
//! (a stall), or the message is at fault (a dead letter). One table, by SQLSTATE class and code,
//! never by message text.
//!
//! A leaf, below the database (`db::DbError::is_transient`) and the pipeline's errors
//! (`error`), which both classify by it.

use tokio_postgres::error::SqlState;

/// True when a PostgreSQL error is transient: the same work may succeed when retried.
pub(crate) fn is_retryable_db(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    match err.code() {
        Some(code) => is_retryable_state(code),
        // No SQLSTATE: a client-side failure. I/O failures (connection reset, refused) are
        // transient; conversion errors are bugs and are not.
        None => std::error::Error::source(err)
            .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()),
    }
}

pub(crate) fn is_retryable_state(code: &SqlState) -> bool {
    classify_state(code) == Fault::Transient
}

/// Whose fault a failure is, which decides what the partition's worker does with it.
///
/// | fault | SQLSTATE classes and kinds | the worker |
/// |---|---|---|
/// | [`Fault::Transient`] | 08 connection, 40 rollback (serialization, deadlock), 53 resources, 57 operator intervention except 57P04, 55P03 lock not available, I/O errors, a closed connection | retries with backoff |
/// | [`Fault::Message`] | 21 cardinality, 22 data exception, 23 integrity (also a deferred constraint at COMMIT), 44 `WITH CHECK OPTION`, P0 PL/pgSQL (`RAISE`, `ASSERT`, no or too many rows), 54 program limit; [`HandlerError::Message`](crate::error::HandlerError::Message) | bisects the batch down to the failing message and dead-letters it |
/// | [`Fault::Environment`] | every other class, unknown ones included (42 undefined table or column, insufficient privilege; 0A cached plan changed; 25 read-only; 2B, 2D, 3D, 3F, 58, F0, XX, 57P04 database dropped, …); [`HandlerError::Environment`](crate::error::HandlerError::Environment) and [`HandlerError::Other`](crate::error::HandlerError::Other) | stalls: commits, dead-letters and stores nothing, retries with capped backoff until it succeeds |
///
/// The rule: a failure is the message's only when it depends on the batch's data, so that
/// bisecting can isolate it. Taking the environment's fault for the message's would turn one
/// `REVOKE` into a dead-lettered stream; an operator fixes the environment, and the partition
/// resumes by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The same work may succeed when retried soon.
    Transient,
    /// The batch's data: one of its messages is bad.
    Message,
    /// The database, the schema, the grants or the handler's code: an operator's to fix.
    Environment,
}

/// The [`Fault`] of a SQLSTATE, by its class (and the few codes that differ from their class).
pub(crate) fn classify_state(code: &SqlState) -> Fault {
    if *code == SqlState::LOCK_NOT_AVAILABLE {
        return Fault::Transient;
    }
    // 57P04: the database was dropped, which no retry soon will fix.
    if *code == SqlState::DATABASE_DROPPED {
        return Fault::Environment;
    }
    match &code.code()[..2] {
        "08" | "40" | "53" | "57" => Fault::Transient,
        "21" | "22" | "23" | "44" | "54" | "P0" => Fault::Message,
        _ => Fault::Environment,
    }
}

/// The [`Fault`] of a PostgreSQL error: by SQLSTATE; without one, a closed connection or an I/O
/// failure is transient, and anything else (a value the client cannot convert: the handler's
/// types do not match the table's) is the environment's.
pub(crate) fn classify_db(err: &tokio_postgres::Error) -> Fault {
    if err.is_closed() {
        return Fault::Transient;
    }
    match err.code() {
        Some(code) => classify_state(code),
        None if std::error::Error::source(err)
            .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()) =>
        {
            Fault::Transient
        }
        None => Fault::Environment,
    }
}

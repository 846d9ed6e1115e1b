//! The statements of `dead-letters list` and `dead-letters redrive`.
//!
//! Every selection of parked dead letters shares one filter (`parked_filter!`): not yet
//! re-driven, the reasons asked for (or, when none is, every reason but those of
//! [`crate::maintenance::redrive::NOT_BY_DEFAULT`], passed as `$2`), a topic, message ids, and a position
//! after the cursor `($5, $6, $7)` (`$5` NULL: from the start), in key order.

/// The filter of the parked dead letters a redrive selects (see the module documentation).
macro_rules! parked_filter {
    () => {
        "WHERE redriven_at IS NULL
  AND CASE WHEN cardinality($1::text[]) = 0 THEN reason <> ALL($2::text[])
           ELSE reason = ANY($1::text[]) END
  AND ($3::text IS NULL OR topic = $3)
  AND (cardinality($4::text[]) = 0 OR message_id = ANY($4::text[]))
  AND ($5::text IS NULL OR (topic, partition, \"offset\") > ($5, $6::int, $7::bigint))
ORDER BY topic, partition, \"offset\"
LIMIT $8"
    };
}

/// The record columns of a dead letter, as [`crate::pipeline::dead_letter::stored`] reads them back.
macro_rules! record_columns {
    () => {
        "SELECT topic, partition, \"offset\", message_id, reason, key, payload, headers, timestamp_ms
FROM dead_letters "
    };
}

/// The columns `dead-letters list` shows, as [`crate::pipeline::dead_letter::Listed`] reads them.
macro_rules! listed_columns {
    () => {
        "SELECT topic, partition, \"offset\", message_id, reason, detail,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
       to_char(redriven_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
       redrive_outcome, redrive_attempts
FROM dead_letters "
    };
}

/// The next batch of parked dead letters to re-drive, locked; rows another redrive holds are
/// skipped (it re-drives them), so two redrives never wait on each other's rows.
pub const LOCK_PARKED: &str = concat!(
    record_columns!(),
    parked_filter!(),
    " FOR UPDATE SKIP LOCKED"
);

/// What a redrive would select, unlocked (`--dry-run`).
pub const PREVIEW_PARKED: &str = concat!(listed_columns!(), parked_filter!());

/// One parked dead letter by position, locked unless another redrive holds it.
pub const LOCK_ONE: &str = concat!(
    record_columns!(),
    "WHERE topic = $1 AND partition = $2 AND \"offset\" = $3 AND redriven_at IS NULL
FOR UPDATE SKIP LOCKED"
);

/// Removes the inbox rows that dead letters put there themselves: those of the same id AND the
/// same position, of a dead letter whose reason wrote one. Only a poison message
/// (`handler_error`) and a handler's rejection get an inbox row with their dead letter; `$5` lists
/// the reasons that write none (the decoding failures and `outside_dedup_window`). The row at the
/// position of an `outside_dedup_window` dead letter is the ORIGINAL application of the message
/// (the guard parked a re-read of it), so it stays, and the message is a duplicate. A row of the
/// id at another position was written by another delivery that was applied (or refused) on its
/// own, and stays too. The caller holds the dead letters' locks, so no other redrive touches these
/// rows.
pub const DELETE_OWN_INBOX_ROWS: &str = "\
DELETE FROM inbox AS i
USING unnest($1::uuid[], $2::text[], $3::int[], $4::bigint[]) AS d(id, t, p, o)
JOIN dead_letters AS l ON l.topic = d.t AND l.partition = d.p AND l.\"offset\" = d.o
WHERE i.message_id = d.id AND i.topic = d.t AND i.partition = d.p AND i.\"offset\" = d.o
  AND l.reason <> ALL($5::text[])";

/// Records what a redrive did with each dead letter: an outcome sets `redriven_at`; a NULL
/// outcome (it failed again) leaves it NULL. A new detail replaces the old one; every attempt
/// counts. Never touches a dead letter already re-driven.
pub const MARK: &str = "\
UPDATE dead_letters AS d
SET redriven_at = CASE WHEN u.outcome IS NULL THEN NULL ELSE now() END,
    redrive_outcome = u.outcome,
    detail = coalesce(u.detail, d.detail),
    redrive_attempts = d.redrive_attempts + 1
FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::text[]) AS u(t, p, o, outcome, detail)
WHERE d.topic = u.t AND d.partition = u.p AND d.\"offset\" = u.o AND d.redriven_at IS NULL";

/// `dead-letters list`: every dead letter of the reasons `$1` (all when empty), topic `$2`,
/// created in the last `$3` seconds (all when NULL), at most `$4`, in key order.
pub const LIST: &str = concat!(
    listed_columns!(),
    "WHERE (cardinality($1::text[]) = 0 OR reason = ANY($1::text[]))
  AND ($2::text IS NULL OR topic = $2)
  AND ($3::float8 IS NULL OR created_at >= now() - make_interval(secs => $3))
ORDER BY topic, partition, \"offset\"
LIMIT $4"
);

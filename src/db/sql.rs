//! Every SQL statement of the pipeline and of the reference handler, in one place: the code that
//! runs them, the benchmarks that measure them and the tests that count them all read them from
//! here, so that what is measured is what runs. (The retention's DELETE and partition DDL are
//! built per table and day in `retention`.)

/// The compare-and-set upsert of one partition's next offset, with its five parameters named
/// by the caller (so that it can be a data-modifying CTE of another statement). The row is
/// written only where it holds the position the writer last committed (`$expected`; NULL: the
/// writer knows none, as when its assignment found no row), and never moves back (a replayed
/// batch leaves it). It returns one row, `inserted` and the position now stored, when it wrote:
/// no row means the database holds another position than the writer's (the database went back,
/// or another member moved it), and an inserted row where one was expected means the row was
/// lost. Either way the caller rolls back.
macro_rules! upsert_offset {
    ($group:literal, $topic:literal, $partition:literal, $next:literal, $expected:literal) => {
        concat!(
            "INSERT INTO consumer_offsets AS c (group_id, topic, partition, next_offset, updated_at) ",
            "VALUES (",
            $group, ", ", $topic, ", ", $partition, ", ", $next,
            ", now()) ON CONFLICT (group_id, topic, partition) DO UPDATE ",
            "SET next_offset = GREATEST(c.next_offset, EXCLUDED.next_offset), ",
            "updated_at = EXCLUDED.updated_at ",
            "WHERE c.next_offset = ", $expected, "::bigint OR ", $expected, "::bigint IS NULL ",
            "RETURNING (xmax = 0) AS inserted, next_offset"
        )
    };
}

/// The compare-and-set upsert of one partition's next offset (`$5`: the position the writer
/// last committed, NULL when it knows none); one row, `inserted` and the position stored, when
/// it wrote.
pub const UPSERT_OFFSET: &str = upsert_offset!("$1", "$2", "$3", "$4", "$5");

/// The stored next offsets of some partitions of a topic for a group.
pub const READ_OFFSETS: &str = "\
SELECT partition, next_offset FROM consumer_offsets
WHERE group_id = $1 AND topic = $2 AND partition = ANY($3)";

/// Creates a partition's position at 0 for a group unless it has one (a queue's first run), so
/// that every offset write after it compares against a value, never against none.
pub const CLAIM_OFFSET: &str = "\
INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, updated_at)
VALUES ($1, $2, $3, 0, now()) ON CONFLICT (group_id, topic, partition) DO NOTHING";

/// For each of some topics, the topic id a group's stored offsets belong to (NULL: none recorded)
/// and whether the group has offsets of it.
pub const READ_TOPIC_IDS: &str = "\
SELECT t.topic, c.topic_id,
       EXISTS (SELECT 1 FROM consumer_offsets o WHERE o.group_id = $1 AND o.topic = t.topic)
FROM unnest($2::text[]) AS t(topic)
LEFT JOIN consumer_topics c ON c.group_id = $1 AND c.topic = t.topic";

/// Records the topic id a group's offsets of a topic belong to (the first one seen, or a new one
/// while the group has no offsets of the topic).
pub const RECORD_TOPIC_ID: &str = "\
INSERT INTO consumer_topics AS c (group_id, topic, topic_id) VALUES ($1, $2, $3)
ON CONFLICT (group_id, topic) DO UPDATE SET topic_id = EXCLUDED.topic_id, recorded_at = now()";

/// The stored next offset of every partition of a topic for a group.
pub const READ_TOPIC_OFFSETS: &str = "\
SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2";

// The batched dedup: `INSERT … SELECT unnest … ON CONFLICT (message_id) DO NOTHING RETURNING`,
// the pattern's own statement. A copy of an id that a concurrent transaction holds uncommitted
// makes this one wait for it; if it commits, the row is skipped without an error (the id is a
// duplicate), if it rolls back, the row is inserted. The conflict check is a probe of the
// arbiter index (`inbox_pkey`) per row whatever the statistics, so no generic plan can hash the
// inbox. `ORDER BY n` costs no sort (the planner knows the ordinality's order) and makes the ids
// go in in array order. (Its speculative insertion costs one more WAL record per new row than a
// plain `INSERT … WHERE NOT EXISTS`: `results/dedup-statement/`.)
macro_rules! insert_ids {
    () => {
        "INSERT INTO inbox (message_id, topic, partition, \"offset\")
SELECT id, $2, $3, o FROM unnest($1::uuid[], $4::bigint[]) WITH ORDINALITY AS t(id, o, n)
ORDER BY n
ON CONFLICT (message_id) DO NOTHING
RETURNING message_id"
    };
}

macro_rules! insert_one_id {
    () => {
        "INSERT INTO inbox (message_id, topic, partition, \"offset\") VALUES ($1, $2, $3, $4)
ON CONFLICT (message_id) DO NOTHING
RETURNING message_id"
    };
}

/// The batched dedup: inserts a batch's ids (unique, sorted) and returns those that were new.
pub const INSERT_IDS: &str = insert_ids!();
/// The per-message dedup: inserts one id, returns it when it was new.
pub const INSERT_ONE_ID: &str = insert_one_id!();
// The same statements, also upserting the partition's next offset ($5 group, $6 next offset,
// $7 the position this member last committed) in a data-modifying CTE: offsets in the database
// cost no extra round trip. After the new ids (`stored` NULL) comes one row whose `message_id`
// is NULL and whose `stored` is the position now stored, NULL when the compare-and-set wrote
// nothing (the database holds another position): the caller then rolls the transaction back.
macro_rules! with_offset {
    ($insert:expr) => {
        concat!(
            "WITH stored AS (",
            upsert_offset!("$5", "$2", "$3", "$6", "$7"),
            "), ids AS (",
            $insert,
            ") SELECT message_id, NULL::bigint AS stored FROM ids UNION ALL SELECT NULL::uuid, ",
            "(SELECT next_offset FROM stored WHERE NOT (inserted AND $7::bigint IS NOT NULL))"
        )
    };
}
/// [`INSERT_IDS`] with the partition's next offset compared-and-set in the same statement.
pub const INSERT_IDS_AND_OFFSET: &str = with_offset!(insert_ids!());
/// [`INSERT_ONE_ID`] with the partition's next offset compared-and-set in the same statement.
pub const INSERT_ONE_ID_AND_OFFSET: &str = with_offset!(insert_one_id!());

/// The dead letters of one partition's batch, one row per Kafka position (a redelivery adds
/// nothing), with each record's Kafka timestamp (what a redrive gives the handler again).
pub const INSERT_DEAD_LETTERS: &str = "\
INSERT INTO dead_letters (topic, partition, \"offset\", message_id, message_id_raw, reason, detail, key, payload, headers, timestamp_ms)
SELECT $1, $2, o, m, mr, r, d, k, p, h, ts
FROM unnest($3::bigint[], $4::text[], $5::bytea[], $6::text[], $7::text[], $8::bytea[], $9::bytea[], $10::jsonb[], $11::bigint[])
     AS t(o, m, mr, r, d, k, p, h, ts)
ON CONFLICT (topic, partition, \"offset\") DO NOTHING";

pub mod redrive;

/// The ledger's statements.
pub mod ledger {
    /// Creates missing accounts at 0, in ascending order.
    pub const ENSURE_ACCOUNTS: &str = "\
    INSERT INTO balances (account_id, amount)
    SELECT a, 0 FROM unnest($1::bigint[]) AS a ORDER BY a
    ON CONFLICT (account_id) DO NOTHING";

    /// Locks the batch's accounts in ascending order and reads their balances.
    pub const LOCK_ACCOUNTS: &str = "\
    SELECT account_id, amount FROM balances
    WHERE account_id = ANY($1::bigint[])
    ORDER BY account_id FOR UPDATE";

    /// Writes the batch's final balances.
    pub const WRITE_BALANCES: &str = "\
    UPDATE balances AS b SET amount = v.amount
    FROM unnest($1::bigint[], $2::bigint[]) AS v(account_id, amount)
    WHERE b.account_id = v.account_id";

    /// Creates one account at 0 when missing (per-message path).
    pub const ENSURE_ONE: &str =
    "INSERT INTO balances (account_id, amount) VALUES ($1, 0) ON CONFLICT (account_id) DO NOTHING";

    /// Applies one amount when the balance stays within 0 and `i64::MAX` (per-message path).
    pub const APPLY_ONE: &str = "\
    UPDATE balances SET amount = amount + $2::bigint
    WHERE account_id = $1 AND amount::numeric + $2::bigint BETWEEN 0 AND 9223372036854775807
    RETURNING amount";

    /// Reads one balance (to say why an amount was refused).
    pub const READ_ONE: &str = "SELECT amount FROM balances WHERE account_id = $1";

    /// Applies each account's net change where its balance takes all of the batch's entries
    /// (between the lowest running sum it needs and the headroom before overflow).
    pub const GUARDED_UPDATE: &str = "\
UPDATE balances AS b SET amount = b.amount + v.delta
FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[])
     AS v(account_id, delta, need, headroom)
WHERE b.account_id = v.account_id AND b.amount BETWEEN v.need AND v.headroom
RETURNING b.account_id";

    /// The planner settings of a batch's ledger statements, sent (in the round trip of its
    /// first statement) before any of them runs, so that every plan the transaction makes or
    /// reuses, custom or generic, was made under them. Each statement looks rows up by key in a
    /// batch's sorted accounts: without them, a generic plan made while `balances` was empty or
    /// small hashes the whole table (a `Hash Join` over a `Seq Scan`, kept by the connection as
    /// the table grows) and locks rows in heap order instead of ascending account order.
    /// Turned off, the only plan left is a nested loop of primary-key probes in the batch's
    /// order. `SET LOCAL` ends with the transaction.
    pub const PLANNER: &str = "SET LOCAL enable_hashjoin = off; \
SET LOCAL enable_mergejoin = off; SET LOCAL enable_seqscan = off";

    /// Before the exact path's lock without waiting.
    pub const SAVEPOINT: &str = "SAVEPOINT ledger_optimistic";

    /// [`PLANNER`] and [`SAVEPOINT`], in one simple query.
    pub const PLANNER_AND_SAVEPOINT: &str = "SET LOCAL enable_hashjoin = off; \
SET LOCAL enable_mergejoin = off; SET LOCAL enable_seqscan = off; SAVEPOINT ledger_optimistic";

    /// Back out of a lock that would wait.
    pub const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT ledger_optimistic";

    /// [`LOCK_ACCOUNTS`] without waiting for a row another batch holds.
    pub const LOCK_ACCOUNTS_NOWAIT: &str = "\
SELECT account_id, amount FROM balances
WHERE account_id = ANY($1::bigint[])
ORDER BY account_id FOR UPDATE NOWAIT";
}

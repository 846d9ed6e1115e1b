-- Every position an operator set with `batch-inbox positions set`: a deliberate skip or rewind,
-- or a loss accepted (the database's position was before the log's start, those records deleted
-- by Kafka). The database is the system of record for positions, so what moved them, from where
-- to where and why is kept beside them.
CREATE TABLE IF NOT EXISTS consumer_offset_changes (
    changed_at  timestamptz NOT NULL DEFAULT now(),
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    from_offset bigint,
    to_offset   bigint      NOT NULL,
    -- What the operator asked for (`--to-offset 120`, `--to-earliest`, …) and said.
    target      text        NOT NULL,
    reason      text        NOT NULL
);
CREATE INDEX IF NOT EXISTS consumer_offset_changes_by_partition
    ON consumer_offset_changes (group_id, topic, partition, changed_at);

-- The next offset to consume per (group, topic, partition), written in the same transaction as
-- the batch it follows, so that it is exactly as durable as the batch's effects. It only moves
-- forward. Kafka's own committed offsets are kept too (lag tooling); a member starts from this
-- one when it is ahead.
CREATE TABLE IF NOT EXISTS consumer_offsets (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   int         NOT NULL,
    next_offset bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);

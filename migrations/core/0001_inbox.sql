-- The inbox: one row per message id ever applied (or rejected). The primary key is the dedup.
CREATE TABLE IF NOT EXISTS inbox (
    message_id   uuid        PRIMARY KEY,
    topic        text        NOT NULL,
    partition    int         NOT NULL,
    "offset"     bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- Messages that were not applied: bad input, and business rejections. One row per Kafka position,
-- so a redelivered bad message adds nothing.
CREATE TABLE IF NOT EXISTS dead_letters (
    topic      text        NOT NULL,
    partition  int         NOT NULL,
    "offset"   bigint      NOT NULL,
    message_id text,
    reason     text        NOT NULL,
    detail     text,
    key        bytea,
    payload    bytea,
    headers    jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);

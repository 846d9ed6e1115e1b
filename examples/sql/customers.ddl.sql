-- The latest state of each customer, keyed by the record key. `source_partition` and
-- `source_offset` are the Kafka position of the message the row holds: the last write wins by
-- that position, so an older message applied later never overwrites a newer one.
CREATE TABLE IF NOT EXISTS customers (
    customer_id      text        PRIMARY KEY,
    doc              jsonb       NOT NULL,
    source_partition int         NOT NULL,
    source_offset    bigint      NOT NULL,
    source_time      timestamptz
);

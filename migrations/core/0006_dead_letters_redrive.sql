-- A dead letter is a parking place: `dead-letters redrive` applies it later, through the handler,
-- and marks it instead of deleting it. `redriven_at` and `redrive_outcome` (`applied`,
-- `duplicate` or `rejected`) are set once, by the transaction that re-drove it; a message that
-- fails again keeps them NULL and counts the attempt. `redrive_attempts` is NOT NULL DEFAULT 0:
-- every existing row reads 0 without a rewrite of the table (a constant default is stored in the
-- catalog), and the redrive's `+ 1` needs no coalesce. `timestamp_ms` is the record's Kafka
-- timestamp, so a re-driven message reaches the handler exactly as it first would have (NULL for
-- rows written before this migration, and for records without one).
ALTER TABLE dead_letters
    ADD COLUMN IF NOT EXISTS redriven_at      timestamptz,
    ADD COLUMN IF NOT EXISTS redrive_outcome  text
        CHECK (redrive_outcome IN ('applied', 'duplicate', 'rejected')),
    ADD COLUMN IF NOT EXISTS redrive_attempts int NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS timestamp_ms     bigint;

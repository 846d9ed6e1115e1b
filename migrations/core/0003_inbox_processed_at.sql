-- Retention: `cleanup` deletes inbox rows older than the retention in small batches, oldest first.
-- This index makes each batch an index range scan instead of a scan of the whole table. It is
-- needed for UUIDv4 ids (no time in the id) and for the default partition of a partitioned inbox.
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);

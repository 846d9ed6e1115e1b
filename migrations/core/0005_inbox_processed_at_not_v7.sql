-- Retention finds expired UUIDv7 rows through the primary key: a UUIDv7 begins with its creation
-- time, so the ids created before a cutoff are one key range. Only other ids (UUIDv4) need the
-- processed_at index. Made partial, it no longer costs a UUIDv7 row an index entry (a B-tree
-- insert and its WAL record). The predicate is `NOT_V7` of src/retention/delete.rs, which the
-- cleanup's query repeats so that the planner can use this index.
DROP INDEX IF EXISTS inbox_processed_at;
CREATE INDEX inbox_processed_at ON inbox (processed_at)
    WHERE get_byte(uuid_send(message_id), 6) >> 4 <> 7;

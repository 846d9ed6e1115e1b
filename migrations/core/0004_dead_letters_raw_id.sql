-- Records are bytes: the id header's value exactly as received (any bytes, NUL included), beside
-- `message_id`, which is text and holds the id only when it is valid UTF-8 without NUL and at
-- most 128 bytes long (else NULL). Key and payload are already bytea.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS message_id_raw bytea;

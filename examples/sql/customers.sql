-- Upserts the latest state of each customer: the record key is the customer id, the value its
-- whole document. Last write wins by (partition, offset): within a batch the newest message of
-- each key is kept, and a stored row is replaced only by a newer position, so an older message
-- applied later (a replay after its inbox row expired) never overwrites a newer one.
-- A record without a (UTF-8) key is rejected as `missing_key`.
WITH input AS (
    SELECT m.id, m.key, m.partition, m."offset", m.timestamp_ms, m.value
    FROM jsonb_to_recordset($1)
        AS m(id uuid, key text, partition int, "offset" bigint, timestamp_ms bigint, value jsonb)
),
latest AS (
    SELECT DISTINCT ON (key) key, partition, "offset", timestamp_ms, value
    FROM input
    WHERE key IS NOT NULL
    ORDER BY key, partition DESC, "offset" DESC
),
upserted AS (
    INSERT INTO customers AS c
        (customer_id, doc, source_partition, source_offset, source_time)
    SELECT key, value, partition, "offset", to_timestamp(timestamp_ms / 1000.0)
    FROM latest
    ORDER BY key
    ON CONFLICT (customer_id) DO UPDATE
    SET doc = excluded.doc,
        source_partition = excluded.source_partition,
        source_offset = excluded.source_offset,
        source_time = excluded.source_time
    WHERE (c.source_partition, c.source_offset)
        < (excluded.source_partition, excluded.source_offset)
)
SELECT id AS message_id, 'missing_key' AS reason, 'a customer record needs a key' AS detail
FROM input
WHERE key IS NULL;

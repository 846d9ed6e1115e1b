-- Appends each new view (`{"path": "/pricing", "user_id": "u1"}`) at its record's time;
-- PostgreSQL routes every row to its time range's partition. A view the table refuses (a path
-- without its leading `/` fails the CHECK) fails the batch: the processor then isolates it and
-- dead-letters it alone as `handler_error`, with PostgreSQL's message.
INSERT INTO page_views (viewed_at, path, user_id, message_id, source_partition, source_offset)
SELECT to_timestamp(m.timestamp_ms / 1000.0), m.value ->> 'path', m.value ->> 'user_id',
       m.message_id, m.partition, m."offset"
FROM jsonb_to_recordset($1)
    AS m(message_id uuid, partition int, "offset" bigint, timestamp_ms bigint, value jsonb);

-- Stores each new CloudEvent (binary mode: the attributes in `ce_*` headers, the data in the
-- value). Run it with `--id-header ce_id --id-format any`: the inbox dedups on the event id,
-- which CloudEvents allows to be any non-empty string (an id that is not text arrives as
-- {"hex": "…"} and is stored as that JSON's text).
INSERT INTO events (message_id, event_id, type, source, data, topic, partition, "offset")
SELECT m.message_id,
       CASE jsonb_typeof(m.id) WHEN 'string' THEN m.id #>> '{}' ELSE m.id::text END,
       m.headers ->> 'ce_type', m.headers ->> 'ce_source', m.value,
       m.topic, m.partition, m."offset"
FROM jsonb_to_recordset($1)
    AS m(message_id uuid, id jsonb, headers jsonb, value jsonb, topic text, partition int,
         "offset" bigint);

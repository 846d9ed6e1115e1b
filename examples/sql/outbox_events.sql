-- Applies the new events of service A's outbox, published by Debezium's outbox event router
-- (run with --id-header id: the router puts the event id in header `id`). The event id is stored
-- from that header, the aggregate type is the topic's last dot-separated part (the router's
-- route.topic.replacement), the aggregate id the record key, the event type the `eventType`
-- header (the router's table.fields.additional.placement=type:header:eventType), the payload the
-- value.
INSERT INTO received_events (event_id, aggregate_type, aggregate_id, event_type, payload, topic,
                             partition, "offset")
SELECT (m.headers ->> 'id')::uuid, split_part(m.topic, '.', -1), m.key,
       m.headers ->> 'eventType', m.value, m.topic, m.partition, m."offset"
FROM jsonb_to_recordset($1)
    AS m(key text, headers jsonb, value jsonb, topic text, partition int, "offset" bigint);

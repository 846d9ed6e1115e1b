-- CloudEvents, one row per event. `event_id` is the event's own id (`ce_id` in Kafka's binary
-- mode, any string); `message_id` the inbox key it maps to (with --id-format any: itself when it
-- is a UUID, else a version-8 UUID of the topic and the id).
CREATE TABLE IF NOT EXISTS events (
    message_id  uuid    PRIMARY KEY,
    event_id    text    NOT NULL,
    type        text,
    source      text,
    data        jsonb   NOT NULL,
    topic       text    NOT NULL,
    partition   int     NOT NULL,
    "offset"    bigint  NOT NULL
);

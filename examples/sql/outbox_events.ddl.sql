-- Service B's table of events received from service A's outbox (scripts/peers/outbox.sh): one row
-- per application. No unique key on purpose: a second application of one event would be a
-- second row, which the chain's check counts (the inbox is what keeps it at one).
CREATE TABLE IF NOT EXISTS received_events (
    event_id uuid NOT NULL,
    aggregate_type text NOT NULL,
    aggregate_id text NOT NULL,
    event_type text NOT NULL,
    payload jsonb NOT NULL,
    topic text NOT NULL,
    partition int NOT NULL,
    "offset" bigint NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS received_events_event_id ON received_events (event_id);

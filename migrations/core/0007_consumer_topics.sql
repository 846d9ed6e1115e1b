-- The Kafka topic id (KIP-516) of the topic incarnation a group's stored offsets belong to. A
-- topic deleted and re-created keeps its name but gets a new id, and its offsets start at 0
-- again: the stored `consumer_offsets` rows then point into a log that no longer exists, and
-- starting there would skip the new topic's first records. The processor records the id when it
-- first resumes a topic from the database and refuses to resume from offsets of another id.
CREATE TABLE IF NOT EXISTS consumer_topics (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    topic_id    uuid        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic)
);

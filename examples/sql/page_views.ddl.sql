-- Page views, one row per view, in a table partitioned by range on the view's time (the Kafka
-- record's timestamp): one partition per year, and a default one for any other time. Add the
-- coming years' partitions ahead of time (a view without its partition lands in the default).
-- No unique key: the inbox alone keeps a redelivered view from being counted twice.
CREATE TABLE IF NOT EXISTS page_views (
    viewed_at        timestamptz NOT NULL,
    path             text        NOT NULL CHECK (path LIKE '/%'),
    user_id          text,
    message_id       uuid        NOT NULL,
    source_partition int         NOT NULL,
    source_offset    bigint      NOT NULL
) PARTITION BY RANGE (viewed_at);
CREATE TABLE IF NOT EXISTS page_views_2025 PARTITION OF page_views
    FOR VALUES FROM ('2025-01-01 00:00+00') TO ('2026-01-01 00:00+00');
CREATE TABLE IF NOT EXISTS page_views_2026 PARTITION OF page_views
    FOR VALUES FROM ('2026-01-01 00:00+00') TO ('2027-01-01 00:00+00');
CREATE TABLE IF NOT EXISTS page_views_2027 PARTITION OF page_views
    FOR VALUES FROM ('2027-01-01 00:00+00') TO ('2028-01-01 00:00+00');
CREATE TABLE IF NOT EXISTS page_views_default PARTITION OF page_views DEFAULT;
CREATE INDEX IF NOT EXISTS page_views_path ON page_views (path, viewed_at);

-- The peer's table of the additive comparison (scripts/peers/compare.sh, WORK=additive): one row
-- per record that Debezium's JDBC sink inserted (connector-amounts.properties). Its columns are
-- the payload's fields of `batch-inbox-bench produce --envelope connect-json` (id, account_id,
-- amount) and a key of its own that the database generates, since the sink writes without a
-- primary key of the record (primary.key.mode=none). An account's balance is
-- sum(amount) GROUP BY account_id; a record id in two rows was counted twice.
CREATE TABLE IF NOT EXISTS amount_entries (
    entry      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         text   NOT NULL,
    account_id bigint NOT NULL,
    amount     bigint NOT NULL
);

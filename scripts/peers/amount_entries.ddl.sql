-- The peer's tables of the additive comparison (scripts/peers/compare.sh, WORK=additive), made
-- before the sink starts (it runs with schema.evolution=none). Their columns are the payload's
-- fields of `batch-inbox-bench produce --envelope connect-json` (id, account_id, amount); an
-- account's balance is sum(amount) GROUP BY account_id.
--
-- One row per record the sink inserted (connector-amounts.properties), with a key of its own that
-- the database generates, since the sink writes without a primary key of the record
-- (primary.key.mode=none): a record id in two rows was counted twice.
CREATE TABLE IF NOT EXISTS amount_entries (
    entry      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         text   NOT NULL,
    account_id bigint NOT NULL,
    amount     bigint NOT NULL
);

-- The same rows keyed by the record's id, for the sink's upsert by a field of the value
-- (connector-amounts-by-id.properties): a record it receives again overwrites its own row.
CREATE TABLE IF NOT EXISTS amount_entries_by_id (
    id         text   PRIMARY KEY,
    account_id bigint NOT NULL,
    amount     bigint NOT NULL
);

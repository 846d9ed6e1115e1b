-- The table of balances_upsert.sql: one balance per account, in minor units. It has the shape
-- and the storage setting of the Rust ledger's own `balances` (its migrations, applied by
-- `batch-inbox migrate --handler ledger`), so that the load test compares the two handlers on
-- the same table; a SQL handler's database gets it from this file, never from `migrate`.
CREATE TABLE IF NOT EXISTS balances (
    account_id bigint PRIMARY KEY,
    amount     bigint NOT NULL
) WITH (fillfactor = 70);

-- The reference handler's table: one balance per account, in minor units, never negative.
CREATE TABLE IF NOT EXISTS balances (
    account_id bigint PRIMARY KEY,
    amount     bigint NOT NULL
);

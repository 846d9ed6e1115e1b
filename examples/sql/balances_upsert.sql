-- The load test's statement: a table shaped like the ledger's, `balances (account_id, amount)`
-- (balances.ddl.sql), each batch's amounts added per account with one aggregate upsert.
-- Unlike the Rust ledger it has no overdraft rule: a balance may go below zero.
--
-- Typed input: the two fields arrive as bigint arrays, one element per new message, taken from
-- the value in Rust; PostgreSQL parses no JSON. A value whose account_id or amount is missing,
-- null, or not an integer in bigint's range is dead-lettered as `invalid_payload`, naming the
-- field, before this runs.
-- batch-inbox: $1 = value /account_id
-- batch-inbox: $2 = value /amount
INSERT INTO balances AS b (account_id, amount)
SELECT account_id, sum(amount)::bigint
FROM unnest($1::bigint[], $2::bigint[]) AS m(account_id, amount)
GROUP BY 1
ORDER BY 1
ON CONFLICT (account_id) DO UPDATE SET amount = b.amount + excluded.amount

-- Each new record's amount added to its account's balance, for records in a Kafka Connect JSON
-- envelope ({"schema": …, "payload": {"id", "account_id", "amount"}}, `batch-inbox-bench produce
-- --envelope connect-json`): the statement our SQL handler runs in the additive comparison with
-- Debezium's JDBC sink (scripts/peers/compare.sh, WORK=additive), on the table of
-- balances.ddl.sql. The inbox has already skipped every record whose id it applied before, so an
-- amount re-sent under the same id is not added again; each batch's amounts are summed per
-- account and added with one upsert, in account order (the rows are locked in key order).
-- Like balances_upsert.sql it has no overdraft rule.
--
-- Typed input from the envelope's payload: a value that is not an envelope, or whose payload's
-- account_id or amount is missing, null or not a bigint, is dead-lettered as `invalid_payload`
-- before this runs.
-- batch-inbox: envelope = connect
-- batch-inbox: $1 = value /account_id
-- batch-inbox: $2 = value /amount
INSERT INTO balances AS b (account_id, amount)
SELECT account_id, sum(amount)::bigint
FROM unnest($1::bigint[], $2::bigint[]) AS m(account_id, amount)
GROUP BY 1
ORDER BY 1
ON CONFLICT (account_id) DO UPDATE SET amount = b.amount + excluded.amount

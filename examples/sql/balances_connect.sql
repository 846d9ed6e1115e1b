-- Each new record's amount added to its account's balance, for records in a Kafka Connect JSON
-- envelope ({"schema": …, "payload": {"id", "account_id", "amount"}}, `batch-inbox-bench produce
-- --envelope connect-json`): the statement our SQL handler runs in the additive comparison with
-- Debezium's JDBC sink (scripts/peers/compare.sh, WORK=additive), on the table of
-- balances.ddl.sql. The inbox has already skipped every record whose id it applied before, so an
-- amount re-sent under the same id is not added again; each batch's amounts are summed per
-- account and added with one upsert, in account order (the rows are locked in key order).
-- Like balances_upsert.sql it has no overdraft rule. A value whose payload is not
-- {"account_id": integer, "amount": integer} is rejected as `invalid_payload`.
WITH input AS (
    SELECT m.message_id, m.value -> 'payload' -> 'account_id' AS account,
           m.value -> 'payload' -> 'amount' AS amount
    FROM jsonb_to_recordset($1) AS m(message_id uuid, value jsonb)
),
checked AS (
    SELECT message_id, account, amount,
           coalesce(jsonb_typeof(account) = 'number' AND account::text ~ '^-?[0-9]{1,18}$'
                    AND jsonb_typeof(amount) = 'number' AND amount::text ~ '^-?[0-9]{1,18}$',
                    false) AS valid
    FROM input
),
applied AS (
    INSERT INTO balances AS b (account_id, amount)
    SELECT account::text::bigint, sum(amount::text::bigint)
    FROM checked
    WHERE valid
    GROUP BY 1
    ORDER BY 1
    ON CONFLICT (account_id) DO UPDATE SET amount = b.amount + excluded.amount
)
SELECT message_id, 'invalid_payload' AS reason,
       'expected a Connect payload {"account_id": integer, "amount": integer}' AS detail
FROM checked
WHERE NOT valid;

-- balances_upsert.sql in the jsonb form: `$1` is the batch's new messages as one jsonb array,
-- read with jsonb_to_recordset and checked in SQL (jsonb_typeof, a pattern per field). The load
-- test runs it beside the typed form to measure what parsing the batch in PostgreSQL costs. A
-- value that is not {"account_id": integer, "amount": integer} is rejected as `invalid_payload`.
WITH input AS (
    SELECT m.message_id AS id, m.value -> 'account_id' AS account, m.value -> 'amount' AS amount
    FROM jsonb_to_recordset($1) AS m(message_id uuid, value jsonb)
),
checked AS (
    SELECT id, account, amount,
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
SELECT id AS message_id, 'invalid_payload' AS reason,
       'expected {"account_id": integer, "amount": integer}' AS detail
FROM checked
WHERE NOT valid;

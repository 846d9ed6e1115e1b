-- Inserts orders (`{"order_id": "o-1", "sku": "A7", "quantity": 3}`) and rejects, by business
-- rule, those it will not take: the rows returned with `message_id` and `reason` (and an optional
-- `detail`) are dead-lettered under that reason, in the same transaction.
--   missing_order_id       no string order_id or sku
--   invalid_quantity       quantity not a whole number from 1 to 1000
--   duplicate_order        an order with this id exists (earlier, or earlier in the batch)
WITH input AS (
    SELECT m.message_id AS id, m."offset", m.value
    FROM jsonb_to_recordset($1) AS m(message_id uuid, "offset" bigint, value jsonb)
),
checked AS (
    SELECT id, "offset", value,
           CASE
               WHEN jsonb_typeof(value -> 'order_id') IS DISTINCT FROM 'string'
                 OR jsonb_typeof(value -> 'sku') IS DISTINCT FROM 'string'
                   THEN 'missing_order_id'
               -- One test per branch: CASE evaluates its branches in order, so the cast
               -- only meets digits.
               WHEN jsonb_typeof(value -> 'quantity') IS DISTINCT FROM 'number'
                   THEN 'invalid_quantity'
               WHEN (value ->> 'quantity') !~ '^[0-9]{1,4}$' THEN 'invalid_quantity'
               WHEN (value ->> 'quantity')::int NOT BETWEEN 1 AND 1000 THEN 'invalid_quantity'
           END AS reason
    FROM input
),
inserted AS (
    INSERT INTO orders (order_id, sku, quantity, message_id)
    SELECT value ->> 'order_id', value ->> 'sku', (value ->> 'quantity')::int, id
    FROM checked
    WHERE reason IS NULL
    ORDER BY "offset"
    ON CONFLICT (order_id) DO NOTHING
    RETURNING message_id
)
SELECT id AS message_id, reason, 'order ' || coalesce(value ->> 'order_id', 'without id') AS detail
FROM checked
WHERE reason IS NOT NULL
UNION ALL
SELECT c.id, 'duplicate_order', 'order ' || (c.value ->> 'order_id') || ' exists already'
FROM checked AS c
WHERE c.reason IS NULL
  AND NOT EXISTS (SELECT 1 FROM inserted AS i WHERE i.message_id = c.id);

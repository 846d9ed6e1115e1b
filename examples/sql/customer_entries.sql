-- Last write wins per customer for records in a Kafka Connect JSON envelope
-- ({"schema": …, "payload": {"id", "account_id", "amount"}}, `batch-inbox-bench produce
-- --envelope connect-json`): the statement our SQL handler runs in the comparison with
-- Debezium's JDBC sink in upsert mode (scripts/peers/compare.sh), on the same table
-- (customer_entries.ddl.sql). Within a batch the newest record of each key (by partition and
-- offset) is written; the inbox has already skipped every record whose id it applied before, so
-- a re-sent older record never overwrites a newer one.
--
-- Typed input from the envelope's payload: a record without a key (or one that is not UTF-8
-- text), or whose payload lacks a string id or an integer account_id or amount, is
-- dead-lettered as `invalid_payload`, naming the field, before this runs.
-- batch-inbox: envelope = connect
-- batch-inbox: $1 = key
-- batch-inbox: $2 = partition
-- batch-inbox: $3 = offset
-- batch-inbox: $4 = value /id
-- batch-inbox: $5 = value /account_id
-- batch-inbox: $6 = value /amount
INSERT INTO customer_entries AS c (customer_id, id, account_id, amount)
SELECT DISTINCT ON (customer_id) customer_id, id, account_id, amount
FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[])
    AS m(customer_id, partition, "offset", id, account_id, amount)
ORDER BY customer_id, partition DESC, "offset" DESC
ON CONFLICT (customer_id) DO UPDATE
SET id = excluded.id, account_id = excluded.account_id, amount = excluded.amount

-- The last entry of each customer (account), keyed by the record key: the table of the
-- comparison with Debezium's JDBC sink (scripts/peers/compare.sh), written by that sink and by
-- `examples/sql/customer_entries.sql` alike. Its columns are the payload's fields of
-- `batch-inbox-bench produce --envelope connect-json` (id, account_id, amount) and the key.
CREATE TABLE IF NOT EXISTS customer_entries (
    customer_id text   PRIMARY KEY,
    id          text   NOT NULL,
    account_id  bigint NOT NULL,
    amount      bigint NOT NULL
);

-- Every write of a row, with the record id it wrote: a last-write-wins table hides a second
-- application of the same record, this log shows it (an id here twice was applied twice).
CREATE TABLE IF NOT EXISTS customer_applications (
    id text NOT NULL
);

CREATE OR REPLACE FUNCTION customer_entries_applied() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO customer_applications (id) VALUES (NEW.id);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER customer_entries_applied
    AFTER INSERT OR UPDATE ON customer_entries
    FOR EACH ROW EXECUTE FUNCTION customer_entries_applied();

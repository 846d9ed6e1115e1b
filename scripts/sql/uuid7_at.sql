-- uuid7_at(ts): a UUIDv7 created at ts: 48 bits of Unix milliseconds, version 7, random bits.
-- Built from a random UUIDv4 (gen_random_uuid) whose first 6 bytes are replaced by the time and
-- whose version nibble 0100 is turned into 0111 (bits 52 and 53 of the 128).
CREATE OR REPLACE FUNCTION uuid7_at(ts timestamptz) RETURNS uuid LANGUAGE sql VOLATILE AS $$
  SELECT encode(
           set_bit(set_bit(
             overlay(uuid_send(gen_random_uuid())
                     PLACING substring(int8send(floor(extract(epoch FROM ts) * 1000)::bigint) FROM 3)
                     FROM 1 FOR 6),
             52, 1), 53, 1),
           'hex')::uuid
$$;

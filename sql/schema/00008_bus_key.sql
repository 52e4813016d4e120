-- +goose Up

-- bus_key: the secret that authenticates the invalidation bus's
-- notifications (internal/bus). Any role that may connect to the database
-- may NOTIFY on the channel pglimit and LISTEN to it: without a secret a
-- database user of the host's (the reference service's console role)
-- could make every replica forget what it remembers, or drop its borrowed
-- units, at will. Each notification now carries a sequence number, the
-- database's clock and an HMAC-SHA256 under this key over both and the
-- payload (BusNotify, BusPing); a replica reads the key when its bus
-- connects and drops any notification whose tag is wrong, whose time is
-- stale or whose number it has heard already. Only pglimit's owner may
-- read the table (grant nothing on it).
--
-- The key is 64 random bytes (four gen_random_uuid(), 488 random bits from
-- the server's strong random source; pgcrypto is not needed), one block of
-- SHA-256, and the table keeps it XORed with HMAC's inner and outer pads
-- too, so that BusNotify computes HMAC-SHA256(key, message) =
-- sha256(outer_pad || sha256(inner_pad || message)) with the built-in
-- sha256() alone. It is a logged table: a key lost in a crash would leave
-- the bus deaf. To change the key, run this table's INSERT again in place
-- of its row; replicas pick it up when their bus connects again.
CREATE TABLE pglimit.bus_key (
    id        boolean NOT NULL PRIMARY KEY DEFAULT true CHECK (id),
    key       bytea   NOT NULL CHECK (length(key) = 64),
    inner_pad bytea   NOT NULL CHECK (length(inner_pad) = 64),
    outer_pad bytea   NOT NULL CHECK (length(outer_pad) = 64)
);

INSERT INTO pglimit.bus_key (key, inner_pad, outer_pad)
SELECT k.key,
       (SELECT decode(string_agg(lpad(to_hex(get_byte(k.key, i) # 54), 2, '0'), '' ORDER BY i), 'hex')
        FROM generate_series(0, 63) AS i),
       (SELECT decode(string_agg(lpad(to_hex(get_byte(k.key, i) # 92), 2, '0'), '' ORDER BY i), 'hex')
        FROM generate_series(0, 63) AS i)
FROM (SELECT uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()) ||
             uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()) AS key) AS k;

-- bus_seq numbers the notifications: a replica drops a number it heard.
CREATE SEQUENCE pglimit.bus_seq;

-- Nothing is granted to PUBLIC on new objects, but default privileges
-- (ALTER DEFAULT PRIVILEGES ... GRANT SELECT ON TABLES TO a reader) may
-- have granted the key to someone: take every grant back but the owner's.
-- +goose StatementBegin
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT c.oid::regclass AS obj, c.relkind, a.grantee
        FROM pg_class AS c
        CROSS JOIN LATERAL aclexplode(c.relacl) AS a
        WHERE c.oid IN ('pglimit.bus_key'::regclass, 'pglimit.bus_seq'::regclass)
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('REVOKE ALL ON %s %s FROM %s',
                       CASE WHEN r.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, r.obj,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP SEQUENCE pglimit.bus_seq;
DROP TABLE pglimit.bus_key;

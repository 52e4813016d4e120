-- +goose Up
-- device_cookie_key: the keys that sign the sign-in throttle's device
-- cookies (middleware/signin's Devices; issue 42, 3). A successful sign-in
-- leaves the client a cookie naming a device of its username, signed with
-- the newest key; a client presenting it is not counted by the username's
-- throttle over every client address (-sign-in-username-failures), so an
-- attacker failing for a user elsewhere cannot lock her out of the
-- devices she signs in from. Every replica of the installation reads the
-- same rows at start-up, so each accepts the cookies another set. Only
-- the service's role (the table's owner) may read them: grant nothing on
-- the table.
--
-- To rotate: INSERT INTO device_cookie_key DEFAULT VALUES, then restart
-- the replicas; the newest key signs, the eight newest verify, so a cookie
-- signed with an older key is good until it lapses (30 days) or its key
-- leaves the eight. Deleting a key ends its cookies at the next restart.
-- The key is 64 random bytes (four gen_random_uuid(), from the server's
-- strong random source; pgcrypto is not needed). A logged table: a key
-- lost in a crash would end every device cookie.
CREATE TABLE device_cookie_key (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key        bytea       NOT NULL DEFAULT uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()) ||
                                            uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())
                                   CHECK (length(key) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO device_cookie_key DEFAULT VALUES;

-- Nothing is granted to PUBLIC on a new table, but default privileges
-- (ALTER DEFAULT PRIVILEGES ... GRANT SELECT ON TABLES TO a reader) may have
-- granted the keys to someone: take every grant back but the owner's.
-- +goose StatementBegin
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee
        FROM pg_class AS c
        CROSS JOIN LATERAL aclexplode(c.relacl) AS a
        WHERE c.oid = 'device_cookie_key'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('REVOKE ALL ON TABLE device_cookie_key FROM %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE device_cookie_key;

-- +goose Up
-- The SQL console's resources and its roles' names (issue 42, 5).
--
-- console_role_key: the secret that names each console user's role. The
-- name was 'studio_console_' and left(md5(database || '/' || username), 16),
-- so anyone who may read pg_roles (every role of the cluster) could tell
-- who uses the console by hashing the usernames they guess. It is now
-- 'studio_console_' and the first 16 hex digits of HMAC-SHA256(key,
-- database || '/' || username), which no one without the key can compute
-- or reverse (ConsoleLoginClaim). Every replica of the installation reads
-- the same row; only the service's role (the table's owner) may read it:
-- grant nothing on it. As pglimit.bus_key, the key is 64 random bytes
-- (four gen_random_uuid(); pgcrypto is not needed), kept XORed with HMAC's
-- inner and outer pads too, so that the built-in sha256() computes the HMAC.
CREATE TABLE console_role_key (
    id        boolean NOT NULL PRIMARY KEY DEFAULT true CHECK (id),
    key       bytea   NOT NULL CHECK (length(key) = 64),
    inner_pad bytea   NOT NULL CHECK (length(inner_pad) = 64),
    outer_pad bytea   NOT NULL CHECK (length(outer_pad) = 64)
);

INSERT INTO console_role_key (key, inner_pad, outer_pad)
SELECT k.key,
       (SELECT decode(string_agg(lpad(to_hex(get_byte(k.key, i) # 54), 2, '0'), '' ORDER BY i), 'hex')
        FROM generate_series(0, 63) AS i),
       (SELECT decode(string_agg(lpad(to_hex(get_byte(k.key, i) # 92), 2, '0'), '' ORDER BY i), 'hex')
        FROM generate_series(0, 63) AS i)
FROM (SELECT uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()) ||
             uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()) AS key) AS k;

-- Nothing is granted to PUBLIC on a new table, but default privileges
-- (ALTER DEFAULT PRIVILEGES ... GRANT SELECT ON TABLES TO a reader) may have
-- granted the key to someone: take every grant back but the owner's.
-- +goose StatementBegin
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee
        FROM pg_class AS c
        CROSS JOIN LATERAL aclexplode(c.relacl) AS a
        WHERE c.oid = 'console_role_key'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('REVOKE ALL ON TABLE console_role_key FROM %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- console_login_role, five arguments: 00006's function, and besides
--
--   - a role of the old name (old_role_name, the md5 one, or any name the
--     user's console_login row had before; '' for none) is renamed to the keyed name,
--     keeping its grants (its password is set again below: a rename clears
--     an MD5 one);
--   - the role's settings bound what one console statement may take:
--     work_mem, max_parallel_workers_per_gather = 0 (each parallel worker is
--     a process of its own with its own memory and temporary files) and
--     temp_file_limit. Setting temp_file_limit, a superuser's parameter,
--     needs SUPERUSER or, from PostgreSQL 15, SET on the parameter (GRANT
--     SET ON PARAMETER temp_file_limit TO the service's role): without it
--     the role runs without it, and the service, which reads what a console
--     session gets (ConsoleSettings), says so at start-up and in GET
--     /api/limits. ALTER ROLE checks each value; the service checks its
--     flags first.
--
-- 00006's two-argument function stays for a replica of the previous
-- version still running during an upgrade.
-- +goose StatementBegin
CREATE FUNCTION console_login_role(role_name text, old_role_name text, password text, temp_file_limit text, work_mem text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('studio console_login_role', 0));
    IF old_role_name <> '' AND old_role_name <> role_name
       AND to_regrole(quote_ident(old_role_name)) IS NOT NULL AND to_regrole(quote_ident(role_name)) IS NULL THEN
        EXECUTE format('ALTER ROLE %I RENAME TO %I', old_role_name, role_name);
    END IF;
    IF to_regrole(quote_ident(role_name)) IS NULL THEN
        EXECUTE format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD %L',
            role_name, password);
    ELSE
        EXECUTE format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD %L',
            role_name, password);
    END IF;
    EXECUTE format('ALTER ROLE %I SET work_mem = %L', role_name, work_mem);
    EXECUTE format('ALTER ROLE %I SET max_parallel_workers_per_gather = 0', role_name);
    BEGIN
        EXECUTE format('ALTER ROLE %I SET temp_file_limit = %L', role_name, temp_file_limit);
    EXCEPTION
        WHEN insufficient_privilege THEN NULL; -- ConsoleSettings tells
    END;
    EXECUTE format('GRANT SELECT ON audit_event, event, alert, message_flow TO %I', role_name);
    BEGIN
        EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', role_name);
    EXCEPTION
        WHEN insufficient_privilege THEN NULL; -- PUBLIC has USAGE on public by default
    END;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION console_login_role(text, text, text, text, text) FROM PUBLIC;

-- +goose Down
-- The roles keep their names and settings (roles are the cluster's).
DROP FUNCTION console_login_role(text, text, text, text, text);
DROP TABLE console_role_key;

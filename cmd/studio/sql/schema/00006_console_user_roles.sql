-- +goose Up
-- Each console user logs in as a role of their own (issue 27): PostgreSQL
-- shows a backend's statement text, and lets a non-superuser cancel or
-- terminate it, only to a role that has the privileges of that backend's
-- session (login) user. With one shared console role every console user
-- could read and end every other's statements; SET ROLE changes nothing
-- there, and RESET ROLE escapes it. console_login maps a user of the
-- service to their role and its password, which only the service's role
-- may read (the console roles are granted nothing here).
CREATE TABLE console_login (
    username   text PRIMARY KEY,
    role_name  text NOT NULL UNIQUE,
    password   text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- console_login_role makes the role a console user logs in as, or makes an
-- existing one so again: it may log in with the given password, has no
-- attribute beyond that, and may read the history tables and nothing else
-- (the service's role owns them, so it may grant them without any other
-- right). Creating a role needs CREATEROLE (or a superuser); without it the
-- call fails and the service falls back to a shared console role, saying
-- what that loses. Roles are the whole cluster's: replicas starting at once,
-- or one new user's first statements on two replicas, take turns through a
-- transaction advisory lock.
-- +goose StatementBegin
CREATE FUNCTION console_login_role(role_name text, password text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('studio console_login_role', 0));
    IF to_regrole(role_name) IS NULL THEN
        EXECUTE format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD %L',
            role_name, password);
    ELSE
        EXECUTE format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD %L',
            role_name, password);
    END IF;
    EXECUTE format('GRANT SELECT ON audit_event, event, alert, message_flow TO %I', role_name);
    BEGIN
        EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', role_name);
    EXCEPTION
        WHEN insufficient_privilege THEN NULL; -- PUBLIC has USAGE on public by default
    END;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION console_login_role(text, text) FROM PUBLIC;

-- +goose Down
-- The roles may have logged in elsewhere; they stay (roles are the
-- cluster's), only this database's map and function go.
DROP FUNCTION console_login_role(text, text);
DROP TABLE console_login;

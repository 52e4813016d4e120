-- The SQL console runs an operator's statement in a read-only transaction,
-- as a role that may only read the history tables when the service could
-- create it.

-- name: ConsoleRoleUsable :one
-- Whether the console role exists and this service may SET ROLE to it.
SELECT (CASE WHEN to_regrole('studio_console') IS NULL THEN false
             ELSE pg_has_role(current_user, 'studio_console', 'MEMBER') END)::boolean AS usable;

-- name: ConsoleEnterRole :exec
-- SET LOCAL ROLE studio_console, for the rest of the transaction.
SELECT set_config('role', 'studio_console', true);

-- name: ConsoleSession :one
-- Who a console connection is: its session user, and whether it is a
-- superuser (a console connection must not be).
SELECT session_user::text AS session_user_name, (current_setting('is_superuser') = 'on')::boolean AS superuser;

-- name: ConsoleCanCreateRoles :one
-- Whether this service's role may make the console users' own roles
-- (CREATEROLE, or a superuser).
SELECT coalesce((SELECT rolsuper OR rolcreaterole FROM pg_catalog.pg_roles WHERE rolname = current_user), false)::boolean AS can;

-- name: ConsoleLoginClaim :one
-- The console login of a user of the service: their role's name (unique in
-- the cluster: it hashes this database's name with the user's) and its
-- password (244 random bits), made on first use. Replicas that claim one
-- user at once get the same row.
INSERT INTO console_login (username, role_name, password)
VALUES (@username::text,
        'studio_console_' || left(md5(current_database() || '/' || @username::text), 16),
        md5(gen_random_uuid()::text) || md5(gen_random_uuid()::text))
ON CONFLICT (username) DO UPDATE SET username = excluded.username
RETURNING role_name, password;

-- name: ConsoleLoginRole :exec
-- Make (or make again) the role of a console login: see console_login_role.
SELECT console_login_role(@role_name::text, @password::text);

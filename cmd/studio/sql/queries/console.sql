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
-- The console login of a user of the service: their role's name and its
-- password (244 random bits), made on first use. The name is
-- 'studio_console_' and the first 16 hex digits of HMAC-SHA256 under the
-- installation's console_role_key of this database's name and the
-- username: unique in the cluster, and nobody without the key can tell
-- whose it is. A row of an older name (left(md5(...), 16), or a key since
-- replaced) takes the keyed name, and old_role_name returns the name it
-- had ('' for a new row), for console_login_role to rename the role. Replicas that claim one
-- user at once get the same row.
WITH keyed AS (
    SELECT 'studio_console_' || left(encode(sha256(k.outer_pad || sha256(k.inner_pad ||
               convert_to(current_database() || '/' || @username::text, 'UTF8'))), 'hex'), 16) AS role_name
    FROM console_role_key AS k
), before AS (
    SELECT l.role_name FROM console_login AS l WHERE l.username = @username::text
)
INSERT INTO console_login (username, role_name, password)
SELECT @username::text, keyed.role_name, md5(gen_random_uuid()::text) || md5(gen_random_uuid()::text)
FROM keyed
ON CONFLICT (username) DO UPDATE SET role_name = excluded.role_name
RETURNING role_name, password, coalesce((SELECT before.role_name FROM before), '')::text AS old_role_name;

-- name: ConsoleLoginRole :exec
-- Make (or make again) the role of a console login, renamed from its old
-- name if it has one, with the console's resource settings: see
-- console_login_role (00008).
SELECT console_login_role(@role_name::text, @old_role_name::text, @password::text,
                          @temp_file_limit::text, @work_mem::text);

-- name: ConsoleBound :exec
-- The console's resource settings for the rest of the transaction, in every
-- way the console logs in (a role of the user's own has them as its
-- settings too): work_mem and no parallel workers, which any session may
-- set, and temp_file_limit when temp_file_limit is not empty (only on the
-- service's own connection of a superuser service: a console role may not
-- set it, console_login_role sets it on the role).
SELECT set_config('work_mem', @work_mem::text, true),
       set_config('max_parallel_workers_per_gather', '0', true),
       CASE WHEN @temp_file_limit::text <> '' THEN set_config('temp_file_limit', @temp_file_limit::text, true) END;

-- name: ConsoleSettings :one
-- What a console session runs with: read once at start-up through the
-- console's own way in, to say what it could not set.
SELECT current_setting('temp_file_limit') AS temp_file_limit,
       current_setting('work_mem') AS work_mem,
       current_setting('max_parallel_workers_per_gather')::int AS parallel_workers;

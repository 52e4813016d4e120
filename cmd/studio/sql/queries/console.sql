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

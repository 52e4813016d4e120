-- +goose Up
-- The SQL console connects as studio_console itself, not as the service
-- switching role inside a transaction: a statement can always switch back
-- to its session user (set_config('role', session_user, true)), so only a
-- session whose user is studio_console keeps the console to the history
-- tables. The role may log in; where the service cannot make it so, the
-- console falls back to SET ROLE and says so in the log (SECURITY.md).
-- +goose StatementBegin
DO $$
BEGIN
    ALTER ROLE studio_console LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS;
EXCEPTION
    WHEN insufficient_privilege OR undefined_object THEN
        RAISE NOTICE 'studio_console cannot log in: %', SQLERRM;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    ALTER ROLE studio_console NOLOGIN;
EXCEPTION
    WHEN insufficient_privilege OR undefined_object THEN NULL;
END
$$;
-- +goose StatementEnd

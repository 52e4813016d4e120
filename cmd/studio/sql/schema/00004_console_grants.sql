-- +goose Up
-- The console's grants when the studio_console role exists but this
-- service's role may not create roles: the role was made by an
-- administrator, or by the migration of another database on the same
-- cluster (roles belong to the whole cluster). 00002 then skipped every
-- grant with the CREATE ROLE it was not allowed, and a console logging in
-- as studio_console could read nothing. A table's owner may grant on it to
-- any role, so this needs no right the service lacks.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regrole('studio_console') IS NOT NULL THEN
        GRANT USAGE ON SCHEMA public TO studio_console;
        GRANT SELECT ON audit_event, event, alert, message_flow TO studio_console;
    END IF;
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE NOTICE 'studio_console not granted the history tables: %', SQLERRM;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- 00002's Down takes the grants back; the role may have had them from it.
SELECT 1;

-- +goose Up
-- The SQL console's role: it may read the history tables and nothing else
-- (no users, no tokens, no limit tables). Creating a role needs CREATEROLE;
-- a service connected without it still works, and its console runs as the
-- service's own role, in a read-only transaction. Roles belong to the whole
-- cluster, so a second database (or a concurrent migrator) finds it there.
-- +goose StatementBegin
DO $$
BEGIN
    BEGIN
        CREATE ROLE studio_console NOLOGIN;
    EXCEPTION
        WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    GRANT USAGE ON SCHEMA public TO studio_console;
    GRANT SELECT ON audit_event, event, alert, message_flow TO studio_console;
    EXECUTE format('GRANT studio_console TO %I', current_user);
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE NOTICE 'studio_console role not created: %', SQLERRM;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The role may serve other databases of the cluster; only this database's
-- grants are taken back.
-- +goose StatementBegin
DO $$
BEGIN
    REVOKE ALL ON audit_event, event, alert, message_flow FROM studio_console;
    REVOKE USAGE ON SCHEMA public FROM studio_console;
EXCEPTION
    WHEN undefined_object OR insufficient_privilege THEN NULL;
END
$$;
-- +goose StatementEnd

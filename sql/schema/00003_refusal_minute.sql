-- +goose Up

-- refusal_minute: how many requests each limit refused, per minute, counted
-- by every replica of the installation (the operator page's chart of
-- refusals per minute). A replica's own memory would show only the
-- refusals it made itself; a replicated service wants the installation's.
-- A row per (limit, minute, dry run): refusals of a limit in dry run
-- (dry_run true) are the ones it would have made and let through. Each
-- limiter adds what it refused in one upsert, at most about once a second
-- while it refuses (internal/observe batches them in memory), and never on
-- a granted request, so the table costs the hot path nothing. minute is the
-- database clock's minute of the write. A row lapses an hour after its
-- minute; housekeeping deletes it then.
CREATE UNLOGGED TABLE pglimit.refusal_minute (
    name       text        NOT NULL,
    minute     timestamptz NOT NULL,
    dry_run    boolean     NOT NULL,
    refusals   bigint      NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (name, minute, dry_run)
);
CREATE INDEX refusal_minute_expires_at ON pglimit.refusal_minute (expires_at);

-- +goose Down
DROP TABLE pglimit.refusal_minute;

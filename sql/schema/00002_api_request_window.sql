-- +goose Up

-- api_request_window: request-rate limits (package middleware/ratelimit),
-- the table ADR-0196 keeps "as it is, because it is already shared". One
-- row per (limiter, key) holds the GCRA state of every policy of that key:
-- policies[i] is a policy's name and tats[i] its theoretical arrival time
-- (TAT) on the database clock. A key with several policies is one row, so
-- that one INSERT ... ON CONFLICT DO UPDATE judges and updates all of them
-- at once, all or nothing, under the row's lock
-- (sql/queries/api_request_window.sql). allowed and decided_at are the
-- last decision, which the statement returns. expires_at is the latest
-- TAT: from then on the row says no more than no row at all, and
-- housekeeping may delete it. The two arrays have the same length: the
-- statements keep them so (a CHECK saying it cost a fifth of a decision's
-- time in the database).
CREATE UNLOGGED TABLE pglimit.api_request_window (
    name       text        NOT NULL,
    key        text        NOT NULL,
    policies   text[]      NOT NULL,
    tats       timestamptz[] NOT NULL,
    allowed    boolean     NOT NULL,
    decided_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (name, key)
) WITH (fillfactor = 90);

-- No index on expires_at, unlike the other limit tables: every request
-- rewrites its key's row, and with no index on a column that changes the
-- rewrite is a HOT update (no index entry written; the old version is
-- pruned in place). An index on expires_at would make every decision
-- write two index entries and bloat both indexes at the request rate.
-- Housekeeping finds lapsed rows with a sequential scan instead, once per
-- sweep (every minute, one replica at a time) — the cheaper side of the
-- trade. fillfactor leaves room on each page for the new versions.
ALTER TABLE pglimit.api_request_window SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);

-- +goose Down
DROP TABLE pglimit.api_request_window;

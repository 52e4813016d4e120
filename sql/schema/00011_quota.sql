-- +goose Up

-- Calendar quotas (package quota): usage of a key per calendar period (a
-- day, a month, a year in a configured time zone), reset at the period's
-- start. One row per (limiter name, key) holds the current period's start
-- and end and what was used in it; the first charge of a new period
-- replaces the old period's count in place (the statement compares the
-- period the row holds with the one the database clock is in), so a key
-- is one row for ever and a quiet key's row lapses at its period's end.
--
-- Two tables of one shape, because durability is a per-limiter choice:
--   quota_usage  UNLOGGED, as every other limit table: a decision costs
--                what a rate decision costs (no WAL), and a crash of the
--                database empties it — every key starts its period again
--                from zero.
--   quota_ledger LOGGED: what metering that bills needs. A charge made in
--                the caller's own transaction (quota.Limiter.ChargeTx) is
--                kept exactly when that transaction commits, and is gone
--                when it rolls back or the server stops before the
--                commit; what committed survives a crash.
-- (Partitions of one table, one UNLOGGED and one LOGGED, would have kept
-- one set of statements; 00004_slot_table.sql measured an upsert through a
-- partitioned parent at twice a plain table's cost and its planning at
-- hundreds of microseconds.)
--
-- used may pass quota: a settle after the fact charges what was spent
-- (quota.Permit.Settle), and an operator may lower a limit below a key's
-- use. No index but the primary key: every decision rewrites its key's
-- row, and with no other index that is a HOT update. Housekeeping finds
-- lapsed rows (period_end passed) with a sequential scan.
CREATE UNLOGGED TABLE pglimit.quota_usage (
    name         text        NOT NULL,
    key          text        NOT NULL,
    period_start timestamptz NOT NULL,
    period_end   timestamptz NOT NULL,
    used         bigint      NOT NULL CHECK (used >= 0),
    allowed      boolean     NOT NULL,
    decided_at   timestamptz NOT NULL,
    PRIMARY KEY (name, key)
) WITH (fillfactor = 90);

CREATE TABLE pglimit.quota_ledger (
    name         text        NOT NULL,
    key          text        NOT NULL,
    period_start timestamptz NOT NULL,
    period_end   timestamptz NOT NULL,
    used         bigint      NOT NULL CHECK (used >= 0),
    allowed      boolean     NOT NULL,
    decided_at   timestamptz NOT NULL,
    PRIMARY KEY (name, key)
) WITH (fillfactor = 90);

-- +goose Down
DROP TABLE pglimit.quota_ledger;
DROP TABLE pglimit.quota_usage;

-- +goose Up

-- ban: a key refused by a rate limit After times within Within is refused
-- for For on every replica (package ban; fail2ban's and rack-attack's
-- Allow2Ban). One row per key holds both the count of its refusals in the
-- window that opened with the first of them (refusals, first_at) and the
-- ban (until; NULL or past: none), so that counting a refusal and banning
-- is one INSERT ... ON CONFLICT DO UPDATE on the key's row. last_at is the
-- statement's now(), kept so that the update reads the clock through the
-- inserted row (excluded.last_at) and calls no volatile function on the
-- key's shard (Citus). banned_at is when the ban began: the statement that
-- bans sets it to its own now(), which tells it apart from one that found
-- the key banned already. The row lapses (expires_at) when both its window
-- and its ban have ended; housekeeping deletes it then. A crash empties
-- the table (UNLOGGED): every ban ends, which errs towards letting in.
CREATE UNLOGGED TABLE pglimit.ban (
    key        text        NOT NULL PRIMARY KEY,
    refusals   int         NOT NULL,
    first_at   timestamptz NOT NULL,
    last_at    timestamptz NOT NULL,
    until      timestamptz,
    banned_at  timestamptz,
    expires_at timestamptz NOT NULL
);
CREATE INDEX ban_expires_at ON pglimit.ban (expires_at);
-- The live bans, read by every replica when its bus connects (BanList).
CREATE INDEX ban_until ON pglimit.ban (until) WHERE until IS NOT NULL;

-- +goose Down
DROP TABLE pglimit.ban;

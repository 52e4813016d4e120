-- +goose Up

-- share: the shares of a rate limit a replica may spend in memory
-- (ratelimit's Options.Shares; issue 43, the cold path). A limiter named
-- name keeps, of each policy of every key, a twentieth of its burst and of
-- its rate apart, in @slots shares (default 8); the database decides what
-- is left (the rest of the burst and of the rate), and a replica that
-- holds a share's lease spends the key's share in memory, with no
-- statement, as its own small GCRA. A share is one row here, held by one
-- Limiter (holder, a random id of the process's Limiter) until expires_at,
-- renewed while it decides and taken over once it lapses: at most @slots
-- replicas spend shares at once, so every replica's admissions together,
-- in memory and in the database, stay within Burst + Limit x L / Window
-- in every interval of length L. A holder stops spending at its lease's
-- end by its own clock (measured from before the statement that gave it),
-- and a new holder spends nothing for a lease after its claim, every key's
-- share empty then, so that a share is never spent by two replicas at the
-- same time, across a takeover, a database restart (which empties this
-- UNLOGGED table) or a holder that was killed.
--
-- A handful of rows per limiter, rewritten a few times a minute: on Citus
-- it stays on the coordinator, a plain table, as the replica registry.
CREATE UNLOGGED TABLE pglimit.share (
    name       text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    slot       int         NOT NULL CHECK (slot >= 1),
    holder     uuid        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (name, slot)
);
CREATE INDEX share_expires_at ON pglimit.share (expires_at);

-- +goose Down
DROP TABLE pglimit.share;

-- Bans (package ban): a key refused by a rate limit @after times within
-- @within_us is refused for @for_us on every replica. The replicas answer
-- a banned key from memory: the statement that bans is followed by a
-- notification (BusNotify, topic "ban"), every replica reads the live bans
-- again when its bus connects (BanList), and an operator's lift
-- (BanLift) is followed by a notification too. So a refusal costs a
-- statement (BanRefused) only until its key is banned; a banned key costs
-- none. Times are the database's: every statement returns its now() so a
-- replica maps them to its own clock.

-- name: BanRefused :one
-- Counts @n refusals of @key (a replica adds up the refusals that arrived
-- while its statement for the key was under way). A key already banned is
-- left as it is. A window that lapsed starts again with these refusals;
-- when the count reaches @after the key is banned until now + @for_us and
-- its count starts from zero. Concurrent refusals of one key serialise on
-- the row lock ON CONFLICT takes, so none is lost and exactly one
-- statement bans (banned_now). The clock is read once, as now() in the
-- inserted row (excluded.last_at), so that on Citus every function the
-- update calls is immutable.
INSERT INTO pglimit.ban AS b (key, refusals, first_at, last_at, until, banned_at, expires_at)
VALUES (@key::text,
        CASE WHEN @n::int >= @after::int THEN 0 ELSE @n::int END,
        now(), now(),
        CASE WHEN @n::int >= @after::int THEN now() + interval '1 microsecond' * @for_us::bigint END,
        CASE WHEN @n::int >= @after::int THEN now() END,
        now() + interval '1 microsecond' * GREATEST(@within_us::bigint, CASE WHEN @n::int >= @after::int THEN @for_us::bigint ELSE 0 END))
ON CONFLICT (key) DO UPDATE SET
    refusals = CASE
        WHEN b.until > excluded.last_at THEN b.refusals
        WHEN b.first_at + interval '1 microsecond' * @within_us::bigint > excluded.last_at
             AND b.refusals + @n::int < @after::int THEN b.refusals + @n::int
        WHEN b.first_at + interval '1 microsecond' * @within_us::bigint <= excluded.last_at
             AND @n::int < @after::int THEN @n::int
        ELSE 0 END,
    first_at = CASE
        WHEN b.until > excluded.last_at THEN b.first_at
        WHEN b.first_at + interval '1 microsecond' * @within_us::bigint > excluded.last_at
             AND b.refusals + @n::int < @after::int THEN b.first_at
        ELSE excluded.last_at END,
    until = CASE
        WHEN b.until > excluded.last_at THEN b.until
        WHEN (b.first_at + interval '1 microsecond' * @within_us::bigint > excluded.last_at AND b.refusals + @n::int >= @after::int)
          OR (b.first_at + interval '1 microsecond' * @within_us::bigint <= excluded.last_at AND @n::int >= @after::int)
             THEN excluded.last_at + interval '1 microsecond' * @for_us::bigint
        ELSE NULL END,
    banned_at = CASE
        WHEN b.until > excluded.last_at THEN b.banned_at
        WHEN (b.first_at + interval '1 microsecond' * @within_us::bigint > excluded.last_at AND b.refusals + @n::int >= @after::int)
          OR (b.first_at + interval '1 microsecond' * @within_us::bigint <= excluded.last_at AND @n::int >= @after::int)
             THEN excluded.last_at
        ELSE NULL END,
    last_at = excluded.last_at,
    -- The row lapses when its window and its ban have both ended: at most
    -- @within_us or @for_us from now.
    expires_at = excluded.last_at + interval '1 microsecond' * GREATEST(@within_us::bigint, @for_us::bigint)
RETURNING refusals, until, (banned_at IS NOT NULL AND banned_at = last_at)::boolean AS banned_now,
          COALESCE(until > last_at, false)::boolean AS banned, last_at AS now;

-- name: BanList :many
-- The live bans, latest first, at most @max (a replica's memory and the
-- operator view are bounded), with the database's clock.
SELECT key, until::timestamptz AS until, banned_at::timestamptz AS banned_at, now()::timestamptz AS now
FROM pglimit.ban
WHERE until > now()
ORDER BY until DESC, key
LIMIT @max::int;

-- name: BanCount :one
-- How many keys are banned now, for the operator view beside its bounded
-- list.
SELECT count(*) FROM pglimit.ban WHERE until > now();

-- name: BanLift :many
-- An operator lifts @key's ban: its row goes (its count of refusals too,
-- so the key starts afresh). Returns whether the key was banned (no row:
-- it had none); the caller then tells every replica (BusNotify), a
-- statement of its own, on the server the replicas listen to.
DELETE FROM pglimit.ban WHERE key = @key::text
RETURNING COALESCE(until > now(), false)::boolean AS banned;

-- name: BanDeleteLapsed :execrows
-- Housekeeping: deletes at most @batch lapsed rows (their window and ban
-- both ended).
DELETE FROM pglimit.ban
WHERE key IN (
    SELECT key FROM pglimit.ban
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
);

-- name: BanDeleteLapsedAll :execrows
-- Housekeeping on Citus (see SlotDeleteLapsedAll): every lapsed row, on
-- all shards at once.
DELETE FROM pglimit.ban WHERE expires_at <= now();

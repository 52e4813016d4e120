-- The failed sign-in throttle (ADR-0196 decision 5). A row counts the
-- failures of one client key in the window that opened with its first
-- failure; the row lapses when the window ends. middleware/signin runs each
-- write on the pool in a statement of its own (its own transaction), so a
-- failure is counted even when the request's own transaction rolls back.

-- name: LoginAttemptGet :one
-- The one read a sign-in costs: the live failures of a key, if any, and the
-- milliseconds until its window ends on the database clock (retry_ms), so
-- Retry-After never depends on a replica's clock.
SELECT failures, expires_at,
       ceil(extract(epoch FROM expires_at - now()) * 1000)::bigint AS retry_ms
FROM pglimit.login_attempt
WHERE key = @key::text AND expires_at > now();

-- The clock is now(), the statement's start, read once: excluded.last_at
-- in the update (the inserted row's now()), so that every function the
-- statement calls on the key's row is immutable, as Citus requires of a
-- statement it runs on one shard (sql/schema/citus/distribute.sql).

-- name: LoginAttemptRecordFailure :one
-- Counts a failed sign-in: opens a new window when there is none or the last
-- one lapsed, adds one to the live one otherwise. Concurrent failures of one
-- key serialise on the row lock ON CONFLICT takes, so none is lost.
INSERT INTO pglimit.login_attempt AS a (key, failures, first_at, last_at, expires_at)
VALUES (@key::text, 1, now(), now(), now() + interval '1 millisecond' * @window_ms::bigint)
ON CONFLICT (key) DO UPDATE SET
    failures   = CASE WHEN a.expires_at <= excluded.last_at THEN 1 ELSE a.failures + 1 END,
    first_at   = CASE WHEN a.expires_at <= excluded.last_at THEN excluded.first_at ELSE a.first_at END,
    last_at    = excluded.last_at,
    expires_at = CASE WHEN a.expires_at <= excluded.last_at THEN excluded.expires_at ELSE a.expires_at END
RETURNING failures, expires_at,
          ceil(extract(epoch FROM expires_at - last_at) * 1000)::bigint AS retry_ms;

-- name: LoginAttemptReserve :one
-- Strict mode: counts the attempt as a failure before the password is
-- checked, but only while the key is under @max_failures, in one atomic
-- statement; a success then clears it. It returns the row when the attempt
-- is reserved, and no row when the limit was already reached: the caller
-- then reads the row (LoginAttemptGet) for when its window ends. ON
-- CONFLICT judges the WHERE against the latest committed row, so the
-- decision is always right.
INSERT INTO pglimit.login_attempt AS a (key, failures, first_at, last_at, expires_at)
VALUES (@key::text, 1, now(), now(), now() + interval '1 millisecond' * @window_ms::bigint)
ON CONFLICT (key) DO UPDATE SET
    failures   = CASE WHEN a.expires_at <= excluded.last_at THEN 1 ELSE a.failures + 1 END,
    first_at   = CASE WHEN a.expires_at <= excluded.last_at THEN excluded.first_at ELSE a.first_at END,
    last_at    = excluded.last_at,
    expires_at = CASE WHEN a.expires_at <= excluded.last_at THEN excluded.expires_at ELSE a.expires_at END
WHERE a.expires_at <= excluded.last_at OR a.failures < @max_failures::int
RETURNING failures, expires_at,
          ceil(extract(epoch FROM expires_at - last_at) * 1000)::bigint AS retry_ms;

-- Every write that lowers a key's count is followed by a notification to
-- every replica (BusNotify, payload "signin", a newline, the key): a replica
-- answers a throttled key's sign-ins from memory until its window ends
-- (package middleware/signin), and forgets it on this notification. The
-- notification is a statement of its own, on the server the replicas
-- listen to: on Citus a statement on a key's shard runs on a worker, whose
-- notifications nobody hears.

-- name: LoginAttemptUnreserve :many
-- Strict mode: gives back a reservation whose attempt never checked a
-- password (a malformed request, a server error). Returns the failures
-- left (no row: nothing given back).
UPDATE pglimit.login_attempt
SET failures = failures - 1
WHERE key = @key::text AND failures > 0 AND expires_at > now()
RETURNING failures;

-- name: LoginAttemptDeleteEmpty :execrows
-- After LoginAttemptUnreserve left a key no failure: its row goes, so that
-- a key whose only attempts were given back (every successful sign-in of
-- a client address: middleware/signin, Scope "address") keeps no row and
-- no window; its next failure opens a new one. failures = 0 is judged
-- against the latest committed row, so a reservation made meanwhile keeps
-- it. (A second statement, not a data-modifying CTE: one statement may
-- not both update and delete a row.)
DELETE FROM pglimit.login_attempt WHERE key = @key::text AND failures = 0;

-- name: LoginAttemptClear :many
-- A successful sign-in, or an operator's reset (signin.Limiter.Reset),
-- clears the key's failures. Returns the failures it had (no row: none),
-- so that replicas are told only when one may remember the key refused.
DELETE FROM pglimit.login_attempt WHERE key = @key::text
RETURNING failures;

-- name: LoginAttemptClearPrefix :many
-- An operator's reset of every key that starts with @prefix and has no
-- "|" after it: the pairs of one username (middleware/signin, Scope
-- "pair": "pair:<username>|" followed by the client address or device,
-- neither of which holds a "|"), one row per client the username failed
-- from, and not the pairs of a longer username that starts with this one
-- and a "|". starts_with, not LIKE: a username may hold % and _. Returns
-- each key and the failures it had, so that replicas are told of each key
-- one may remember refused. On Citus a statement on every shard; resets
-- are rare.
DELETE FROM pglimit.login_attempt
WHERE starts_with(key, @prefix::text) AND strpos(substr(key, length(@prefix::text) + 1), '|') = 0
RETURNING key, failures;

-- name: LoginAttemptList :many
-- The live throttles, for the operator view: the first @max by lapse time,
-- latest first (anyone may make a throttle row by failing a sign-in, so
-- the list is bounded; LoginAttemptCount counts them all).
SELECT key, failures, first_at, last_at, expires_at
FROM pglimit.login_attempt
WHERE expires_at > now()
ORDER BY expires_at DESC, key
LIMIT @max::int;

-- name: LoginAttemptCount :one
-- How many throttles are live, for the operator view beside its bounded
-- list (LoginAttemptList).
SELECT count(*) FROM pglimit.login_attempt WHERE expires_at > now();

-- name: LoginAttemptDeleteLapsed :execrows
-- Housekeeping: deletes at most @batch lapsed rows.
DELETE FROM pglimit.login_attempt
WHERE key IN (
    SELECT key FROM pglimit.login_attempt
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
);

-- name: LoginAttemptDeleteLapsedAll :execrows
-- Housekeeping on Citus (see SlotDeleteLapsedAll): every lapsed row, on
-- all shards at once.
DELETE FROM pglimit.login_attempt WHERE expires_at <= now();

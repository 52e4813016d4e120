-- Request-rate limits (package middleware/ratelimit): GCRA, the generic
-- cell rate algorithm, per key and policy, in pglimit.api_request_window.
--
-- A policy allows Limit units per Window with a burst B. Its emission
-- interval T = Window / Limit is what one unit costs in time. A key's
-- state per policy is one timestamp, its theoretical arrival time (TAT).
-- A request of cost c is admitted when
--     greatest(TAT, now) + c*T <= now + B*T
-- and then TAT becomes greatest(TAT, now) + c*T. So in any interval of
-- length L at most B + L/T units are admitted, and a key that was quiet
-- may spend B at once (burst B admits B units at once, as
-- go-redis/redis_rate counts it). The caller passes, per policy, c*T (the
-- increment) and B*T (the tolerance) as intervals, so the statements
-- only add and compare timestamps: no numeric, no multiplication.
--
-- One statement per decision, INSERT ... ON CONFLICT DO UPDATE ...
-- RETURNING: two replicas deciding for one key at once serialise on the
-- row lock ON CONFLICT takes, and the second judges the first one's
-- result; no advisory lock, no read-then-write. A key's first request
-- inserts its row (the INSERT branch: empty state, every TAT is now); every
-- later one takes the DO UPDATE branch, where the GCRA is written inline in
-- the SET's sub-select (a SQL function would be planned again on every
-- call). "now" is clock_timestamp(), read once per decision inside that
-- sub-select, so after the row lock is held: decisions on one key are
-- stamped in the order they are made. A refused request writes only
-- allowed and decided_at; its TATs stay as they were.
--
-- There are two statements of the same algorithm. APIRequestWindowDecideOne
-- is the common case, one policy, written with scalars; it measured about
-- a third of the database time of the general APIRequestWindowDecide,
-- whose arrays of policies need a sub-select with an aggregate. The
-- ratelimit tests run both over the same histories and compare every
-- decision.
--
-- Both read their parameters from a CTE: sqlc cannot rewrite parameters
-- inside a multi-column SET's sub-select.

-- name: APIRequestWindowDecideOne :one
-- Judges a request of the key against one policy (@increment = cost x T,
-- @tolerance = burst x T) when the key's row holds that policy alone or
-- does not exist yet. It returns no row when the row holds other policies
-- too (a per-request policy function gave the key several): the caller
-- then decides with APIRequestWindowDecide, which keeps them.
WITH request AS (
    SELECT @policy::text AS policy, @increment::interval AS increment, @tolerance::interval AS tolerance
)
INSERT INTO pglimit.api_request_window AS w (name, key, policies, tats, allowed, decided_at, expires_at)
SELECT @name::text, @key::text, ARRAY[r.policy],
       ARRAY[CASE WHEN r.increment <= r.tolerance THEN c.at + r.increment ELSE c.at END],
       r.increment <= r.tolerance, c.at,
       CASE WHEN r.increment <= r.tolerance THEN c.at + r.increment ELSE c.at END
FROM request AS r
-- The clock, read once: a sub-select whose target list calls a volatile
-- function is never merged into the query around it.
CROSS JOIN (SELECT clock_timestamp() AS at) AS c
ON CONFLICT (name, key) DO UPDATE SET (tats, allowed, decided_at, expires_at) = (
    SELECT CASE WHEN x.ok THEN ARRAY[x.tat] ELSE w.tats END, x.ok, x.at,
           CASE WHEN x.ok THEN x.tat ELSE w.expires_at END
    FROM (
        SELECT c.at, greatest(w.tats[1], c.at) + r.increment AS tat,
               greatest(w.tats[1], c.at) + r.increment <= c.at + r.tolerance AS ok
        FROM request AS r
        CROSS JOIN (SELECT clock_timestamp() AS at) AS c
    ) AS x
)
WHERE w.policies = ARRAY[@policy::text]
RETURNING allowed, tats[1]::timestamptz AS tat, decided_at;

-- name: APIRequestWindowDecide :one
-- Judges a request of the key against every policy of the request
-- (@policies, with @increments = cost x T and @tolerances = burst x T, one
-- per policy) and admits it only if all of them have room, in which case
-- all of them are spent, or none. The row keeps the TATs of other policies
-- the key was judged by (a per-request policy function may give a key
-- different policies over time) until they pass. It returns the decision,
-- the key's policies and TATs after it (a refused request's as they were)
-- and the time it was made; the caller derives remaining units, reset and
-- Retry-After from them.
WITH request AS (
    SELECT @policies::text[] AS policies, @increments::interval[] AS increments,
           @tolerances::interval[] AS tolerances
)
INSERT INTO pglimit.api_request_window AS w (name, key, policies, tats, allowed, decided_at, expires_at)
SELECT @name::text, @key::text,
       CASE WHEN f.ok THEN f.policies ELSE '{}' END,
       CASE WHEN f.ok THEN f.tats ELSE '{}' END,
       f.ok, c.at,
       CASE WHEN f.ok THEN f.last ELSE c.at END
FROM request AS r
CROSS JOIN (SELECT clock_timestamp() AS at) AS c
CROSS JOIN LATERAL (
    SELECT coalesce(bool_and(r.increments[i] <= r.tolerances[i]), true) AS ok,
           array_agg(r.policies[i]) AS policies, array_agg(c.at + r.increments[i]) AS tats,
           max(c.at + r.increments[i]) AS last
    FROM generate_subscripts(r.policies, 1) AS i
) AS f
ON CONFLICT (name, key) DO UPDATE SET (policies, tats, allowed, decided_at, expires_at) = (
    SELECT CASE WHEN NOT f.ok THEN w.policies
                WHEN w.policies = f.policies THEN f.policies
                -- The key has other policies too: keep those still ahead of now.
                ELSE f.policies || ARRAY(
                    SELECT w.policies[o] FROM generate_subscripts(w.policies, 1) AS o
                    WHERE w.tats[o] > c.at AND w.policies[o] <> ALL (r.policies))
           END,
           CASE WHEN NOT f.ok THEN w.tats
                WHEN w.policies = f.policies THEN f.tats
                ELSE f.tats || ARRAY(
                    SELECT w.tats[o] FROM generate_subscripts(w.policies, 1) AS o
                    WHERE w.tats[o] > c.at AND w.policies[o] <> ALL (r.policies))
           END,
           f.ok, c.at,
           CASE WHEN f.ok THEN greatest(w.expires_at, f.last) ELSE w.expires_at END
    FROM request AS r
    CROSS JOIN (SELECT clock_timestamp() AS at) AS c
    CROSS JOIN LATERAL (
        -- Every policy of the request, judged: ok only if all fit.
        -- (policies and tats are aggregated from the same rows, so they
        -- pair up in whatever order the rows come.)
        SELECT coalesce(bool_and(b.tat <= c.at + b.tolerance), true) AS ok,
               array_agg(b.policy) AS policies, array_agg(b.tat) AS tats, max(b.tat) AS last
        FROM (
            SELECT r.policies[i] AS policy, r.tolerances[i] AS tolerance,
                   greatest(w.tats[array_position(w.policies, r.policies[i])], c.at) + r.increments[i] AS tat
            FROM generate_subscripts(r.policies, 1) AS i
        ) AS b
    ) AS f
)
RETURNING allowed, policies, tats, decided_at;

-- name: APIRequestWindowBorrow :one
-- Borrows units of one policy for a replica to spend in memory
-- (ratelimit.Options.Borrow): it spends, all or nothing, @need units (the
-- request at hand) and up to @want more, at most a share of what the key
-- has free (what the bucket holds now, in units of @unit, the policy's T):
-- half while at least half is free, a quarter down to a fifth, a tenth
-- below, so a replica never takes much of a bucket others are emptying.
-- The units are the GCRA's: the batch moves the key's TAT from base to tat,
-- and the replica may spend the unit ending at base + k*T only up to
-- base + (k-1)*T on the database clock, which keeps every replica's
-- admissions within burst + rate x L. Like APIRequestWindowDecideOne it
-- returns no row when the key's row holds other policies too. A refusal
-- (units 0) writes only allowed and decided_at.
WITH request AS (
    SELECT @policy::text AS policy, @unit::interval AS unit, @tolerance::interval AS tolerance,
           @need::int AS need, @want::int AS want
)
INSERT INTO pglimit.api_request_window AS w (name, key, policies, tats, allowed, decided_at, expires_at, borrowed)
SELECT @name::text, @key::text, ARRAY[r.policy],
       ARRAY[c.at + r.unit * b.units], b.units > 0, c.at, c.at + r.unit * b.units, b.units
FROM request AS r
CROSS JOIN (SELECT clock_timestamp() AS at) AS c
-- A new row's bucket is full: tolerance / unit units free.
CROSS JOIN LATERAL (
    SELECT CASE WHEN r.need > f.free THEN 0
                ELSE greatest(r.need, least(r.need + r.want, floor(f.free / 2)::int)) END AS units
    FROM (SELECT floor(extract(epoch FROM r.tolerance) / extract(epoch FROM r.unit)) AS free) AS f
) AS b
ON CONFLICT (name, key) DO UPDATE SET (tats, allowed, decided_at, expires_at, borrowed) = (
    SELECT CASE WHEN x.units > 0 THEN ARRAY[x.base + r.unit * x.units] ELSE w.tats END,
           x.units > 0, x.at,
           CASE WHEN x.units > 0 THEN x.base + r.unit * x.units ELSE w.expires_at END,
           x.units
    FROM request AS r
    CROSS JOIN LATERAL (
        SELECT f.at, f.base,
               CASE WHEN r.need > f.free THEN 0
                    ELSE greatest(r.need, least(r.need + r.want, floor(f.free * CASE
                        WHEN f.free * 2 >= f.burst THEN 0.5
                        WHEN f.free * 5 >= f.burst THEN 0.25
                        ELSE 0.1 END)::int)) END AS units
        FROM (
            SELECT c.at, greatest(w.tats[1], c.at) AS base,
                   floor(extract(epoch FROM c.at + r.tolerance - greatest(w.tats[1], c.at))
                         / extract(epoch FROM r.unit)) AS free,
                   floor(extract(epoch FROM r.tolerance) / extract(epoch FROM r.unit)) AS burst
            FROM (SELECT clock_timestamp() AS at) AS c
        ) AS f
    ) AS x
)
WHERE w.policies = ARRAY[@policy::text]
RETURNING allowed, tats[1]::timestamptz AS tat, decided_at, borrowed;

-- name: APIRequestWindowGiveBack :execrows
-- Gives back the units of a batch a replica did not spend: the key's TAT
-- moves back to @kept (the end of what the replica spent; the statement's
-- start when that is past: an earlier "now" only says less, as GCRA takes
-- the later of the TAT and the clock), only if it still ends where the batch ended (@tat): once
-- another decision spent after the batch, its units are in the middle and
-- lapse by themselves instead.
UPDATE pglimit.api_request_window
SET tats = ARRAY[greatest(@kept::timestamptz, statement_timestamp())],
    expires_at = greatest(@kept::timestamptz, statement_timestamp())
WHERE name = @name::text AND key = @key::text AND policies = ARRAY[@policy::text]
  AND tats[1] = @tat::timestamptz;

-- name: APIRequestWindowSettle :one
-- Settles a request admitted earlier at an estimated cost, now that its
-- actual cost is known (ratelimit.Permit.Settle): @deltas holds, per
-- policy of @policies, (actual - estimate) x T. A further charge (the
-- deltas positive) is made whatever the room: the work is done; each TAT
-- moves from the later of itself and now, as a decision's does. A refund
-- (negative) is made only while the key's TATs are still those the
-- admission left (@tats, in @policies' order): once another decision spent
-- after it, the refunded units are in the middle and lapse by themselves,
-- as a borrowed batch's do (APIRequestWindowGiveBack); nor does a refund
-- move a TAT before now (a full bucket holds no more). A TAT of a policy
-- not in @policies is kept. It returns the key's policies and TATs after
-- it and the time; no row when nothing was settled (a refund too late, or
-- a row that lapsed).
UPDATE pglimit.api_request_window AS w
SET tats = ARRAY(
        SELECT CASE WHEN j IS NULL THEN w.tats[o]
                    WHEN (@deltas::interval[])[j] > interval '0'
                        THEN greatest(w.tats[o], statement_timestamp()) + (@deltas::interval[])[j]
                    ELSE greatest(w.tats[o] + (@deltas::interval[])[j], statement_timestamp())
               END
        FROM generate_subscripts(w.policies, 1) AS o
        CROSS JOIN LATERAL (SELECT array_position(@policies::text[], w.policies[o]) AS j) AS p
        ORDER BY o),
    expires_at = greatest(w.expires_at, (
        SELECT max(greatest(w.tats[o], statement_timestamp()) + (@deltas::interval[])[array_position(@policies::text[], w.policies[o])])
        FROM generate_subscripts(w.policies, 1) AS o)),
    decided_at = statement_timestamp()
WHERE w.name = @name::text AND w.key = @key::text
  AND ((@deltas::interval[])[1] > interval '0'
       OR ARRAY(SELECT w.tats[array_position(w.policies, q)] FROM unnest(@policies::text[]) WITH ORDINALITY AS u(q, i) ORDER BY i)
          = @tats::timestamptz[])
RETURNING w.policies, w.tats, w.decided_at;

-- name: APIRequestWindowReset :exec
-- An operator clears a key's state (ratelimit.Limiter.Reset); every
-- replica is then told to forget what it remembers of the key (BusNotify,
-- payload "rate/", the limiter's name, a newline, the key).
DELETE FROM pglimit.api_request_window WHERE name = @name::text AND key = @key::text;

-- name: APIRequestWindowList :many
-- The keys of one limiter whose state still counts, latest decision
-- first, for operators.
SELECT key, policies, tats, allowed, decided_at, expires_at
FROM pglimit.api_request_window
WHERE name = @name::text AND expires_at > now()
ORDER BY decided_at DESC, key
LIMIT @max_rows::int;

-- name: APIRequestWindowKeys :many
-- The keys of one limiter whose state still counts, in key order after
-- @after, at most @max of them, with the database's clock: looking
-- without spending (ratelimit.Limiter.Keys).
SELECT key, policies, tats, now()::timestamptz AS now
FROM pglimit.api_request_window
WHERE name = @name::text AND key > @after::text AND expires_at > now()
ORDER BY key
LIMIT @max::int;

-- name: APIRequestWindowDeleteLapsed :execrows
-- Housekeeping: deletes at most @batch rows whose every TAT has passed (a
-- sequential scan: the table has no index on expires_at, see its
-- migration). A row a decision holds is skipped; one a decision moved
-- forward since this statement's snapshot is judged again under its lock
-- and kept.
DELETE FROM pglimit.api_request_window
WHERE (name, key) IN (
    SELECT name, key FROM pglimit.api_request_window
    WHERE expires_at <= now()
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
);

-- On Citus (sql/schema/citus/distribute.sql) a decision is a function
-- distributed with the table, which runs on the shard of its key
-- (migration 00006 says why). ratelimit makes every decision with these
-- there, and with the statements above on one server.

-- name: APIRequestWindowDecideOneOnShard :one
-- APIRequestWindowDecideOne on Citus, in one statement on the key's shard
-- (the common case, one policy): Citus routes an INSERT ... ON CONFLICT by
-- its key, but only while its DO UPDATE calls immutable functions, so the
-- clock is read once, as now() in the inserted row (excluded.decided_at,
-- evaluated by the node that received the statement), and the sums are
-- made on UTC timestamps (timestamptz + interval is stable; timestamp +
-- interval is immutable, and the same for intervals of microseconds). The
-- time of a decision is the later of that clock and a microsecond after
-- the key's last decision: a statement that waited for the key's row lock
-- behind another decides after it, so a key's decisions are stamped in
-- the order they are made, as on one server, and every decision is exact
-- at its stamp. Back to back on one Citus cluster it cost every node 10 to
-- 20 % less CPU than pglimit.rate_decide: most of a decision's cost on
-- Citus is Citus' own per statement (docs/scaling.md). No row when the
-- key's row holds other policies.
INSERT INTO pglimit.api_request_window AS w (name, key, policies, tats, allowed, decided_at, expires_at)
VALUES (@name::text, @key::text, ARRAY[@policy::text],
        ARRAY[CASE WHEN @increment::interval <= @tolerance::interval THEN now() + @increment::interval ELSE now() END],
        @increment::interval <= @tolerance::interval, now(),
        CASE WHEN @increment::interval <= @tolerance::interval THEN now() + @increment::interval ELSE now() END)
ON CONFLICT (name, key) DO UPDATE SET
    -- at = greatest(last decision + 1 µs, the clock); tat = greatest(TAT, at) + increment;
    -- admitted when tat <= at + tolerance. Each is written out where it is used: Citus
    -- takes no sub-select here.
    tats = CASE WHEN greatest((w.tats[1] AT TIME ZONE 'UTC'), greatest((w.decided_at AT TIME ZONE 'UTC') + interval '1 microsecond', (excluded.decided_at AT TIME ZONE 'UTC'))) + @increment::interval
                <= greatest((w.decided_at AT TIME ZONE 'UTC') + interval '1 microsecond', (excluded.decided_at AT TIME ZONE 'UTC')) + @tolerance::interval
           THEN ARRAY[(greatest((w.tats[1] AT TIME ZONE 'UTC'), greatest((w.decided_at AT TIME ZONE 'UTC') + interval '1 microsecond', (excluded.decided_at AT TIME ZONE 'UTC'))) + @increment::interval) AT TIME ZONE 'UTC'] ELSE w.tats END,
    allowed = greatest((w.tats[1] AT TIME ZONE 'UTC'), greatest((w.decided_at AT TIME ZONE 'UTC') + interval '1 microsecond', (excluded.decided_at AT TIME ZONE 'UTC'))) + @increment::interval
                <= greatest((w.decided_at AT TIME ZONE 'UTC') + interval '1 microsecond', (excluded.decided_at AT TIME ZONE 'UTC')) + @tolerance::interval,
    decided_at = (greatest((w.decided_at AT TIME ZONE 'UTC') + interval '1 microsecond', (excluded.decided_at AT TIME ZONE 'UTC'))) AT TIME ZONE 'UTC',
    expires_at = CASE WHEN greatest((w.tats[1] AT TIME ZONE 'UTC'), greatest((w.decided_at AT TIME ZONE 'UTC') + interval '1 microsecond', (excluded.decided_at AT TIME ZONE 'UTC'))) + @increment::interval
                <= greatest((w.decided_at AT TIME ZONE 'UTC') + interval '1 microsecond', (excluded.decided_at AT TIME ZONE 'UTC')) + @tolerance::interval
                 THEN (greatest((w.tats[1] AT TIME ZONE 'UTC'), greatest((w.decided_at AT TIME ZONE 'UTC') + interval '1 microsecond', (excluded.decided_at AT TIME ZONE 'UTC'))) + @increment::interval) AT TIME ZONE 'UTC' ELSE w.expires_at END
WHERE w.policies = ARRAY[@policy::text]
RETURNING allowed, tats[1]::timestamptz AS tat, decided_at;

-- name: APIRequestWindowDecideOnShard :one
-- APIRequestWindowDecide on Citus.
SELECT d.allowed::boolean AS allowed, d.policies::text[] AS policies, d.tats::timestamptz[] AS tats,
       d.decided_at::timestamptz AS decided_at
FROM pglimit.rate_decide(@name::text, @key::text, @policies::text[], @increments::interval[], @tolerances::interval[]) AS d;

-- name: APIRequestWindowBorrowOnShard :one
-- APIRequestWindowBorrow on Citus: no row when the key's row holds other
-- policies too.
SELECT b.allowed::boolean AS allowed, b.tat::timestamptz AS tat, b.decided_at::timestamptz AS decided_at,
       b.borrowed::int AS borrowed
FROM pglimit.rate_borrow(@name::text, @key::text, @policy::text, @unit::interval, @tolerance::interval,
                         @need::int, @want::int) AS b;

-- name: APIRequestWindowDeleteLapsedAll :execrows
-- Housekeeping on Citus (see SlotDeleteLapsedAll): every row whose TATs
-- have all passed, on all shards at once; a row a decision moved forward
-- meanwhile is judged again under its lock and kept.
DELETE FROM pglimit.api_request_window WHERE expires_at <= now();

-- Leased slots (ADR-0196 decisions 2 and 5): heavy permits, the per-token
-- in-flight cap and the upload window are all rows of pglimit.slot, told
-- apart by kind (operators read them through the views heavy_permit,
-- request_in_flight and upload_window). The permit package runs these
-- statements with the kind as a parameter, so each is written once for
-- every kind. One row per slot of a scope: a claim takes a free slot
-- number, a release marks the row lapsed, the next claim of that number
-- replaces it in place.
--
-- A round trip is one pgx Batch, one implicit transaction: SlotLockScopes
-- (the scopes of its claims), SlotRelease (the releases queued with it),
-- then SlotClaimOne for one claim or SlotClaim for several. The locks come
-- first so that a batch never waits for a scope's lock while holding a
-- row lock another batch's claim needs. A batch of releases alone is
-- SlotRelease by itself, without SlotLockScopes' planner settings: a
-- statement of their own cost more than the release's planning (12 % of
-- an in-flight claim + release at 1 client in BenchmarkInFlight, six
-- interleaved runs).
--
-- Claims and releases are combined: those that one replica's callers make
-- while its previous batch is in flight travel together in the next one,
-- as databases commit their log for many transactions at once. A batch of
-- n claims costs one lock statement, one claim and one commit. A release
-- leaves at once in a batch of its own, or in the one about to leave; its
-- caller (a Handler, before its answer completes) waits for it.

-- name: SlotLockScopes :exec
-- Serialises claimers of the same scopes until their transaction ends. It
-- runs before SlotClaim in the same batch, so the claim's snapshot is taken
-- after the lock and sees every slot committed by the claimer before it.
-- Without it two claimers pick the same free slot, the loser's ON CONFLICT
-- ... WHERE finds a live row and it is refused although other slots are
-- free. Locks are taken in one order (by key), so that two batches cannot
-- deadlock; the two-key form (class 1196) keeps clear of the application's
-- own single-key advisory locks. A collision of two scopes' hashes only
-- makes them take turns.
-- It also sets, for the rest of the transaction, two planner settings for
-- SlotClaim: no JIT (its default row estimates for unnest and
-- generate_series look costly, and compiling would cost far more than
-- running it), and the generic plan, which a prepared claim then plans once
-- per connection instead of on every execution (planning is most of a
-- small claim's server time).
SELECT set_config('jit', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       pg_advisory_xact_lock(1196, k.key)
FROM (
    SELECT DISTINCT hashtext(@kind::text || ':' || s.scope) AS key
    FROM unnest(@scopes::text[]) AS s(scope)
    ORDER BY 1
) AS k;

-- name: SlotClaim :many
-- Judges a batch of claims in order and grants each one a slot in every
-- scope it wants, or nothing at all. A claim has its own scope (pos 1: a
-- user's cap on an endpoint, a token, a user's uploads) and may share a
-- second one with other claims (pos 2: the installation's cap). A claim is
-- granted when both have room after the claims before it in the batch:
-- first the claims of each own scope are ranked, and those within its room
-- fit; then, of those, the claims of each shared scope are ranked the same
-- way. This equals judging the claims one after another as long as claims
-- with the same own scope share the same second scope, which the permit
-- package makes sure of when it puts claims together. The lowest free
-- slots of 1..cap are taken with INSERT ... ON CONFLICT DO UPDATE ... WHERE
-- expired, so a lapsed holder is replaced in place and a live one never is.
-- A cap lowered below the live slots takes nothing until enough lapse.
-- Every (claim, scope) comes back with its granted slot (0: none), the
-- scope's live slots before the batch, its cap, and the milliseconds until
-- the first of those lapses (0 if none); which scope refused a claim is
-- told from these and the grants before it, as judging one claim after
-- another would tell it (the first ranking alone would blame a claim's own
-- scope for room that claims refused by the shared scope only seemed to
-- take). Times come from the database
-- clock, never a replica's.
WITH want AS (
    SELECT (@claims::int[])[i] AS claim, (@positions::int[])[i] AS pos,
           (@scopes::text[])[i] AS scope, (@caps::int[])[i] AS cap
    FROM generate_subscripts(@scopes::text[], 1) AS i
),
live AS (
    -- = ANY on the primary key: an index scan of the kind's partition
    -- whatever dead rows the churn of claims and releases has left.
    SELECT s.scope, array_agg(s.slot) AS slots, min(s.expires_at) AS first_lapse
    FROM pglimit.slot AS s
    WHERE s.kind = @kind::text AND s.scope = ANY(@scopes::text[]) AND s.expires_at > now()
    GROUP BY s.scope
),
room AS (
    SELECT DISTINCT ON (w.scope) w.scope, w.cap, coalesce(l.slots, '{}') AS slots, l.first_lapse,
           coalesce(cardinality(l.slots), 0) AS live,
           greatest(w.cap - coalesce(cardinality(l.slots), 0), 0) AS room
    FROM want AS w
    LEFT JOIN live AS l ON l.scope = w.scope
    ORDER BY w.scope
),
own AS (
    SELECT w.claim, row_number() OVER (PARTITION BY w.scope ORDER BY w.claim) <= r.room AS fits
    FROM want AS w
    JOIN room AS r ON r.scope = w.scope
    WHERE w.pos = 1
),
shared AS (
    SELECT w.claim, row_number() OVER (PARTITION BY w.scope ORDER BY w.claim) <= r.room AS fits
    FROM want AS w
    JOIN room AS r ON r.scope = w.scope
    JOIN own AS o ON o.claim = w.claim AND o.fits
    WHERE w.pos = 2
),
takes AS (
    -- Each granted claim's turn among the granted claims of each scope.
    SELECT w.claim, w.scope, row_number() OVER (PARTITION BY w.scope ORDER BY w.claim) AS turn
    FROM want AS w
    JOIN own AS o ON o.claim = w.claim AND o.fits
    LEFT JOIN shared AS s ON s.claim = w.claim
    WHERE coalesce(s.fits, true)
),
free AS (
    -- The lowest free slots of each scope, as many as its turns.
    SELECT r.scope, f.slot, row_number() OVER (PARTITION BY r.scope ORDER BY f.slot) AS turn
    FROM room AS r
    CROSS JOIN LATERAL (
        SELECT g.slot
        FROM generate_series(1, r.cap) AS g(slot)
        WHERE g.slot <> ALL (r.slots)
        ORDER BY g.slot
        LIMIT (SELECT count(*) FROM takes AS t WHERE t.scope = r.scope)
    ) AS f
),
granted AS (
    INSERT INTO pglimit.slot AS s (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
    SELECT @kind::text, t.scope, f.slot, (@lease_ids::text[])[t.claim]::uuid, (@holders::text[])[t.claim],
           (@endpoints::text[])[t.claim], @replica::text, now(),
           now() + interval '1 millisecond' * (@lease_ms::bigint[])[t.claim]
    FROM takes AS t
    JOIN free AS f ON f.scope = t.scope AND f.turn = t.turn
    ON CONFLICT (kind, scope, slot) DO UPDATE
        SET lease_id = excluded.lease_id, holder = excluded.holder,
            endpoint = excluded.endpoint, replica = excluded.replica,
            claimed_at = excluded.claimed_at, expires_at = excluded.expires_at
        WHERE s.expires_at <= now()
    RETURNING s.scope, s.slot, s.lease_id
)
SELECT w.claim::int AS claim, w.pos::int AS pos,
       coalesce(g.slot, 0)::int AS granted_slot,
       r.live::int AS live, r.cap::int AS cap,
       coalesce(ceil(extract(epoch FROM r.first_lapse - now()) * 1000), 0)::bigint AS first_lapse_ms
FROM want AS w
JOIN room AS r ON r.scope = w.scope
LEFT JOIN granted AS g ON g.scope = w.scope AND g.lease_id = (@lease_ids::text[])[w.claim]::uuid
ORDER BY w.claim, w.pos;

-- name: SlotClaimOne :many
-- The claim of a batch that carries only one (a lone caller, the common
-- case): the same decision as SlotClaim, for one claim, in the few small
-- steps one claim needs instead of SlotClaim's ranking of many. For each
-- scope, in the claim's order: its live slots (a range of the primary
-- key), and, when they are fewer than its cap, the lowest slot of 1..cap
-- that no live row holds (a probe of the primary key per slot, stopping at
-- the first free one; a lapsed row counts as free, and the INSERT replaces
-- it in place). The rows go in only when every scope has a free slot, so a
-- claim takes all of its scopes or none; under SlotLockScopes nobody else
-- takes a slot of these scopes meanwhile. A cap lowered below the live
-- slots takes nothing until enough lapse. Each scope comes back with its
-- granted slot (0: none), its live slots, its cap, and the milliseconds
-- until the first of them lapses (0 if none).
WITH want AS MATERIALIZED (
    SELECT w.pos, w.scope, w.cap, l.live, l.first_lapse,
           CASE WHEN l.live < w.cap THEN (
               SELECT g.slot
               FROM generate_series(1, w.cap) AS g(slot)
               WHERE NOT EXISTS (
                   SELECT FROM pglimit.slot AS s
                   WHERE s.kind = @kind::text AND s.scope = w.scope AND s.slot = g.slot AND s.expires_at > now())
               ORDER BY g.slot
               LIMIT 1)
           END AS free
    FROM (SELECT i AS pos, (@scopes::text[])[i] AS scope, (@caps::int[])[i] AS cap
          FROM generate_subscripts(@scopes::text[], 1) AS i) AS w
    CROSS JOIN LATERAL (
        SELECT count(*) AS live, min(s.expires_at) AS first_lapse
        FROM pglimit.slot AS s
        WHERE s.kind = @kind::text AND s.scope = w.scope AND s.expires_at > now()
    ) AS l
),
granted AS (
    INSERT INTO pglimit.slot AS s (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
    SELECT @kind::text, w.scope, w.free, (@lease_id::text)::uuid, @holder::text, @endpoint::text, @replica::text, now(),
           now() + interval '1 millisecond' * @lease_ms::bigint
    FROM want AS w
    WHERE NOT EXISTS (SELECT FROM want AS x WHERE x.free IS NULL)
    ON CONFLICT (kind, scope, slot) DO UPDATE
        SET lease_id = excluded.lease_id, holder = excluded.holder,
            endpoint = excluded.endpoint, replica = excluded.replica,
            claimed_at = excluded.claimed_at, expires_at = excluded.expires_at
        WHERE s.expires_at <= now()
    RETURNING s.scope, s.slot
)
SELECT w.pos::int AS pos, coalesce(g.slot, 0)::int AS granted_slot, w.live::int AS live, w.cap::int AS cap,
       coalesce(ceil(extract(epoch FROM w.first_lapse - now()) * 1000), 0)::bigint AS first_lapse_ms
FROM want AS w
LEFT JOIN granted AS g ON g.scope = w.scope
ORDER BY w.pos;

-- name: SlotRelease :execrows
-- Releases every slot of a batch of leases in one statement: each row is
-- marked lapsed (expires_at = now()), not deleted, so the next claim of the
-- slot replaces it in place and both statements are HOT updates (no index
-- entry written; see the migration 00004). The lease id makes sure a holder
-- whose slot lapsed and was claimed again by someone else never touches the
-- new holder's row. The scopes bound the search to the primary key's range
-- of each scope (a lease id alone has no index), so a release reads only
-- the rows of its own scopes however many other slots are held; a lease has
-- rows only in its own scopes, so matching any of the batch's scopes with
-- any of its leases releases exactly the batch's slots. (Lease ids travel
-- as text: pgx's simple protocol, which PgBouncer needs, cannot encode a
-- uuid array.)
UPDATE pglimit.slot AS s
SET expires_at = now()
WHERE s.kind = @kind::text
  AND s.scope = ANY(@scopes::text[])
  AND s.lease_id = ANY((@lease_ids::text[])::uuid[])
  AND s.expires_at > now();

-- name: SlotList :many
-- The live slots of one kind, for operators (GET /api/limits).
SELECT scope, slot, holder, endpoint, replica, claimed_at, expires_at
FROM pglimit.slot
WHERE kind = @kind::text AND expires_at > now()
ORDER BY scope, slot;

-- name: SlotDeleteLapsed :many
-- Housekeeping: deletes at most @batch lapsed slots (released or run out)
-- of every kind at once and counts them by kind. SKIP LOCKED leaves rows a
-- claimer is replacing right now to that claimer. There is no index on
-- expires_at (so that claims and releases are HOT updates): this reads the
-- table, which holds the live slots and the lapsed ones not yet swept.
WITH gone AS (
    DELETE FROM pglimit.slot
    WHERE (kind, scope, slot) IN (
        SELECT kind, scope, slot FROM pglimit.slot
        WHERE expires_at <= now()
        ORDER BY expires_at
        LIMIT @batch::int
        FOR UPDATE SKIP LOCKED
    )
    RETURNING kind
)
SELECT kind, count(*)::bigint AS deleted
FROM gone
GROUP BY kind
ORDER BY kind;

-- Leased slots (ADR-0196 decisions 2 and 5): heavy permits, the per-token
-- in-flight cap and the upload window are all rows of pglimit.slot, told
-- apart by kind (operators read them through the views heavy_permit,
-- request_in_flight and upload_window). The permit package runs these
-- statements with the kind as a parameter, so each is written once for
-- every kind. One row per slot of a scope: a claim takes a free slot
-- number, a release marks the row lapsed, the next claim of that number
-- replaces it in place.
--
-- A claim's first try takes no lock. A round trip that carries one claim
-- alone (a lone caller, the common case) is one statement, its own
-- transaction: SlotClaimLone for one scope, SlotClaimTwo for two. A
-- round trip of first claims that each want one scope of their own, no two
-- the same, is SlotRelease (the releases queued with them, if any) and
-- SlotClaimEach, in one pgx Batch, one implicit transaction. A claim that
-- loses the free slot it picked to another claim is not refused: it comes
-- back with room and no slot (SlotClaimLone, SlotClaimEach), or fails
-- whole (SlotClaimTwo, SlotClaim: a live holder makes the statement fail,
-- so a claim in two scopes never keeps half of itself), and is judged
-- again under the scope lock: SlotLockScopes, SlotRelease, then
-- SlotClaimLone or SlotClaimTwo for one claim, SlotClaim for several (as
-- is every batch the lock-free forms do not fit: claims sharing a scope,
-- claims in two scopes). The locks come first so that a batch never waits
-- for a scope's lock while holding a row lock another batch's claim needs,
-- and every claim statement writes its rows in one order (by scope, then
-- slot), so that two claims that wait for each other's rows cannot
-- deadlock. Without the lock, two claims of a scope only race when they
-- arrive together from different round trips (other replicas, or the two
-- round trips one replica may have in flight); in TestBurstGrantsExactlyCap
-- (16 claimers of one scope from four pools at once, round after round)
-- every race is judged again and no claim is refused with a slot free. The
-- lock was a statement of its own in every claim's round trip, costing
-- about as much as the one-row upsert a claim is judged against
-- (pg_stat_statements).
--
-- A release alone is one statement by the primary key of its slots
-- (SlotReleaseOne, SlotReleaseTwo); releases that travel together are one
-- SlotRelease, without SlotLockScopes' planner settings.
--
-- Claims and releases are combined: those that one replica's callers make
-- while its previous round trip is in flight travel together in the next
-- one, as databases commit their log for many transactions at once. A
-- release leaves at once in a round trip of its own, or in the one about
-- to leave; its caller (a Handler, before its answer completes) waits for
-- it.

-- name: SlotLockScopes :exec
-- Serialises claimers of the same scopes until their transaction ends, by
-- locking one row of pglimit.slot_lock per scope (a bucket of the scope's
-- hash; migration 00007): a row lock no role but pglimit's owner can take
-- or hold (an advisory lock, which this was, any role may take and hold).
-- It runs before the claim statement in the same batch, so the claim's
-- snapshot is taken after the lock and sees every slot committed by the
-- claimer before it: claims judged under the lock never race each other
-- (only the lock-free first tries of other round trips). Rows are locked
-- in one order (by bucket), so that two batches cannot deadlock. A bucket
-- shared by two scopes only makes them take turns. A missing row (a new
-- database, or after a crash emptied the UNLOGGED table) is inserted
-- here; one that exists is locked and left as it is (ON CONFLICT DO UPDATE
-- locks the row even when its WHERE is false, and writes nothing).
-- Before locking it sets, for the rest of the transaction, lock_timeout
-- (@lock_timeout_ms, half the Leaser's Timeout: a claim that cannot have
-- its turn fails with SQLSTATE 55P03, unavailable, on a connection that
-- stays usable, rather than waiting until its caller gives up) and two
-- planner settings for SlotClaim: no JIT (its default row estimates for
-- unnest and generate_series look costly, and compiling would cost far
-- more than running it), and the generic plan, which a prepared claim
-- then plans once per connection instead of on every execution (planning
-- is most of a small claim's server time). The settings are a
-- materialized CTE the rows are joined with, so they are made before the
-- first row is locked.
WITH settings AS MATERIALIZED (
    SELECT set_config('jit', 'off', true) AS jit,
           set_config('plan_cache_mode', 'force_generic_plan', true) AS plan_cache_mode,
           set_config('lock_timeout', @lock_timeout_ms::int || 'ms', true) AS lock_timeout
)
INSERT INTO pglimit.slot_lock AS l (bucket)
SELECT DISTINCT hashtext(@kind::text || ':' || s.scope) & 4095
FROM unnest(@scopes::text[]) AS s(scope)
CROSS JOIN settings
ORDER BY 1
ON CONFLICT (bucket) DO UPDATE SET bucket = excluded.bucket WHERE false;

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
    ORDER BY t.scope, f.slot
    ON CONFLICT (kind, scope, slot) DO UPDATE
        SET lease_id = excluded.lease_id, holder = excluded.holder,
            endpoint = excluded.endpoint, replica = excluded.replica,
            claimed_at = excluded.claimed_at, expires_at = excluded.expires_at,
            slot = CASE WHEN s.expires_at <= now() THEN s.slot END
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

-- name: SlotClaimTwo :many
-- The claim of a round trip that carries nothing else, in two scopes (a
-- heavy permit: the user's cap on the endpoint and the installation's),
-- all or nothing: SlotClaimLone for each scope, in one statement. The rows
-- go in only when both scopes have fewer live slots than their caps. It
-- runs without the scope lock on a first try, so another claim may take
-- the slot it picked in one scope first; then it must take nothing in the
-- other either, and one statement cannot take back a row it wrote. So a
-- live holder found on conflict is not skipped (as SlotClaimLone's WHERE
-- does) but makes the statement fail: its DO UPDATE sets the slot number
-- to NULL, which the NOT NULL of the primary key refuses (SQLSTATE 23502
-- on pglimit.slot.slot), and the whole statement, and its transaction,
-- takes nothing. The permit package reads that error as a lost race and
-- judges the claim again under the scope lock. A lapsed holder is replaced
-- in place, keeping its slot number. The scalar parameters (no arrays)
-- keep the generic plan as cheap as any custom one. Each scope comes back
-- with its granted slot (0: none), its live slots, its cap, and the
-- milliseconds until the first of them lapses (0 if none).
WITH want AS MATERIALIZED (
    SELECT w.pos, w.scope, w.cap, l.live, l.first_lapse, l.free
    FROM (SELECT 1 AS pos, @scope1::text AS scope, @cap1::int AS cap
          UNION ALL SELECT 2, @scope2::text, @cap2::int) AS w
    CROSS JOIN LATERAL (
        SELECT count(*) AS live, min(x.expires_at) AS first_lapse,
               coalesce(min(x.rn) FILTER (WHERE x.slot <> x.rn), count(*) + 1)::int AS free
        FROM (
            SELECT s.slot, s.expires_at, row_number() OVER (ORDER BY s.slot) AS rn
            FROM pglimit.slot AS s
            WHERE s.kind = @kind::text AND s.scope = w.scope AND s.expires_at > now()
        ) AS x
    ) AS l
),
granted AS (
    INSERT INTO pglimit.slot AS s (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
    SELECT @kind::text, w.scope, w.free, (@lease_id::text)::uuid, @holder::text, @endpoint::text, @replica::text, now(),
           now() + interval '1 millisecond' * @lease_ms::bigint
    FROM want AS w
    WHERE NOT EXISTS (SELECT FROM want AS x WHERE x.live >= x.cap)
    ORDER BY w.scope
    ON CONFLICT (kind, scope, slot) DO UPDATE
        SET lease_id = excluded.lease_id, holder = excluded.holder,
            endpoint = excluded.endpoint, replica = excluded.replica,
            claimed_at = excluded.claimed_at, expires_at = excluded.expires_at,
            slot = CASE WHEN s.expires_at <= now() THEN s.slot END
    RETURNING s.scope, s.slot
)
SELECT w.pos::int AS pos, coalesce((SELECT g.slot FROM granted AS g WHERE g.scope = w.scope), 0)::int AS granted_slot,
       w.live::int AS live, w.cap::int AS cap,
       coalesce(ceil(extract(epoch FROM w.first_lapse - now()) * 1000), 0)::bigint AS first_lapse_ms
FROM want AS w
ORDER BY w.pos;

-- name: SlotClaimLone :one
-- The claim of a round trip that carries nothing else, in one scope (an
-- in-flight or upload slot, the common case): one statement, no lock, no
-- planner settings. It reads the scope's live slots once (a range of the
-- primary key, in slot order) and takes the lowest free slot number: with
-- the live slots s_1 < s_2 < ... numbered 1, 2, ... in that order, the
-- first s_i that is not i is the free slot i, and when there is none, the
-- slot after the last (O(live slots), never O(cap)). It takes it only when
-- fewer than @cap slots are live (so a cap lowered below the live slots
-- takes nothing until enough lapse), with INSERT ... ON CONFLICT DO UPDATE
-- ... WHERE expired: a lapsed holder is replaced in place, a live one never
-- is. Without SlotLockScopes two claims of one scope may pick the same free
-- slot at once; the loser's ON CONFLICT ... WHERE then finds a live row and
-- takes nothing. It still answers the scope's live slots as its snapshot
-- saw them: granted_slot 0 with live < cap is a lost race, never a full
-- scope, and the permit package judges that claim again under the scope
-- lock (SlotLockScopes, then this statement); 0 with live >= cap is a
-- refusal, with the milliseconds until the first live slot lapses. The
-- scalar parameters (no arrays) keep the generic plan as cheap as any
-- custom one, so it is planned once per connection without the planner
-- settings of SlotLockScopes.
WITH cur AS (
    SELECT count(*) AS live, min(l.expires_at) AS first_lapse,
           coalesce(min(l.rn) FILTER (WHERE l.slot <> l.rn), count(*) + 1)::int AS free
    FROM (
        SELECT s.slot, s.expires_at, row_number() OVER (ORDER BY s.slot) AS rn
        FROM pglimit.slot AS s
        WHERE s.kind = @kind::text AND s.scope = @scope::text AND s.expires_at > now()
    ) AS l
),
granted AS (
    INSERT INTO pglimit.slot AS s (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
    SELECT @kind::text, @scope::text, c.free, (@lease_id::text)::uuid, @holder::text, @endpoint::text, @replica::text,
           now(), now() + interval '1 millisecond' * @lease_ms::bigint
    FROM cur AS c
    WHERE c.live < @cap::int
    ON CONFLICT (kind, scope, slot) DO UPDATE
        SET lease_id = excluded.lease_id, holder = excluded.holder,
            endpoint = excluded.endpoint, replica = excluded.replica,
            claimed_at = excluded.claimed_at, expires_at = excluded.expires_at
        WHERE s.expires_at <= now()
    RETURNING s.slot
)
SELECT coalesce((SELECT g.slot FROM granted AS g), 0)::int AS granted_slot, c.live::int AS live,
       coalesce(ceil(extract(epoch FROM c.first_lapse - now()) * 1000), 0)::bigint AS first_lapse_ms
FROM cur AS c;

-- name: SlotClaimEach :many
-- Judges a batch of claims that each want one scope of their own, no two
-- the same scope (in-flight or upload slots of different tokens or users,
-- the common batch under load): SlotClaimLone for each, in one statement,
-- without the scope lock and without SlotClaim's ranking (each claim is
-- alone in its scope). A claim comes back with granted_slot 0 and live <
-- cap when another claim took the slot it picked first (a lost race,
-- judged again under the lock), with granted_slot 0 and live >= cap when
-- its scope is full.
WITH cur AS MATERIALIZED (
    SELECT w.claim, w.scope, w.cap, l.live, l.first_lapse, l.free
    FROM (SELECT i AS claim, (@scopes::text[])[i] AS scope, (@caps::int[])[i] AS cap
          FROM generate_subscripts(@scopes::text[], 1) AS i) AS w
    CROSS JOIN LATERAL (
        SELECT count(*) AS live, min(x.expires_at) AS first_lapse,
               coalesce(min(x.rn) FILTER (WHERE x.slot <> x.rn), count(*) + 1)::int AS free
        FROM (
            SELECT s.slot, s.expires_at, row_number() OVER (ORDER BY s.slot) AS rn
            FROM pglimit.slot AS s
            WHERE s.kind = @kind::text AND s.scope = w.scope AND s.expires_at > now()
        ) AS x
    ) AS l
),
granted AS (
    INSERT INTO pglimit.slot AS s (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
    SELECT @kind::text, c.scope, c.free, ((@lease_ids::text[])[c.claim])::uuid, (@holders::text[])[c.claim],
           (@endpoints::text[])[c.claim], @replica::text, now(),
           now() + interval '1 millisecond' * (@lease_ms::bigint[])[c.claim]
    FROM cur AS c
    WHERE c.live < c.cap
    ORDER BY c.scope
    ON CONFLICT (kind, scope, slot) DO UPDATE
        SET lease_id = excluded.lease_id, holder = excluded.holder,
            endpoint = excluded.endpoint, replica = excluded.replica,
            claimed_at = excluded.claimed_at, expires_at = excluded.expires_at
        WHERE s.expires_at <= now()
    RETURNING s.scope, s.slot
)
SELECT c.claim::int AS claim, coalesce(g.slot, 0)::int AS granted_slot, c.live::int AS live, c.cap::int AS cap,
       coalesce(ceil(extract(epoch FROM c.first_lapse - now()) * 1000), 0)::bigint AS first_lapse_ms
FROM cur AS c
LEFT JOIN granted AS g ON g.scope = c.scope
ORDER BY c.claim;

-- name: SlotReleaseOne :exec
-- Releases the slot of a lease in one scope (an in-flight or upload slot):
-- SlotRelease for a round trip that carries one release alone, by the
-- slot's primary key instead of a range of its scope. Every value is a
-- scalar and the key is whole, so the planner finds one row whatever it
-- knows of the table, the generic plan is as cheap as any custom one, and
-- it is planned once per connection. (An array form, scope = ANY(...) AND
-- slot = ANY(...), was planned afresh on most executions — 24,867 plans in
-- 37,989 calls in pg_stat_statements, 49 µs each — and its custom plan
-- could even read the whole kind when the statistics said it was small.)
UPDATE pglimit.slot AS s
SET expires_at = now()
WHERE s.kind = @kind::text AND s.scope = @scope::text AND s.slot = @slot::int
  AND s.lease_id = (@lease_id::text)::uuid
  AND s.expires_at > now();

-- name: SlotReleaseTwo :exec
-- Releases the slots of a lease in two scopes (a heavy permit: the user's
-- and the installation's): SlotReleaseOne for each, in one statement.
WITH first AS (
    UPDATE pglimit.slot AS s
    SET expires_at = now()
    WHERE s.kind = @kind::text AND s.scope = @scope1::text AND s.slot = @slot1::int
      AND s.lease_id = (@lease_id::text)::uuid
      AND s.expires_at > now()
    RETURNING 1
),
second AS (
    UPDATE pglimit.slot AS s
    SET expires_at = now()
    WHERE s.kind = @kind::text AND s.scope = @scope2::text AND s.slot = @slot2::int
      AND s.lease_id = (@lease_id::text)::uuid
      AND s.expires_at > now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM first) + (SELECT count(*) FROM second);

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

-- name: SlotRenew :many
-- Renews the leases of slots a replica keeps between requests (the
-- in-flight cap's Options.Keep, internal/slots): each row, by its primary
-- key and its lease id, lapses @lease_ms from now again, if it is still
-- live and still the lease's. One statement for every kept slot of a
-- replica that needs it (a slot kept in use is renewed once every few
-- seconds, never per request). The lease ids of the rows renewed come
-- back; a slot whose lease id does not is no longer held (it lapsed) and is
-- forgotten. (Lease ids
-- travel as text, as in SlotRelease.)
UPDATE pglimit.slot AS s
SET expires_at = now() + interval '1 millisecond' * @lease_ms::bigint
FROM (SELECT (@scopes::text[])[i] AS scope, (@slots::int[])[i] AS slot, (@lease_ids::text[])[i] AS lease_id
      FROM generate_subscripts(@scopes::text[], 1) AS i) AS k
WHERE s.kind = @kind::text AND s.scope = k.scope AND s.slot = k.slot
  AND s.lease_id = k.lease_id::uuid
  AND s.expires_at > now()
RETURNING s.lease_id;

-- name: SlotList :many
-- The live slots of one kind, for operators (GET /api/limits).
SELECT scope, slot, holder, endpoint, replica, claimed_at, expires_at
FROM pglimit.slot
WHERE kind = @kind::text AND expires_at > now()
ORDER BY scope, slot;

-- name: SlotListFirst :many
-- The first @max live slots of one kind by lapse time, latest first, for
-- the operator view (GET /api/limits), which lists a bounded number of
-- rows and counts the rest (SlotCount).
SELECT scope, slot, holder, endpoint, replica, claimed_at, expires_at
FROM pglimit.slot
WHERE kind = @kind::text AND expires_at > now()
ORDER BY expires_at DESC, scope, slot
LIMIT @max::int;

-- name: SlotCount :one
-- How many slots of one kind are live, beside SlotListFirst.
SELECT count(*) FROM pglimit.slot WHERE kind = @kind::text AND expires_at > now();

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

-- name: SlotClaimOnShard :one
-- A claim of one slot of one scope on Citus (sql/schema/citus/distribute.sql),
-- where the statements above are not one shard's: pglimit.slot_claim
-- (migration 00006), distributed with the slot table, judges it on the
-- scope's shard to the end (a lost race is tried again there). A claim in
-- two scopes runs it for each, in scope order, in one transaction, and
-- rolls back unless both were granted.
SELECT c.granted_slot::int AS granted_slot, c.live::int AS live, c.first_lapse_ms::bigint AS first_lapse_ms
FROM pglimit.slot_claim(@scope::text, @kind::text, @cap::int, (@lease_id::text)::uuid, @holder::text,
                        @endpoint::text, @replica::text, @lease_ms::bigint) AS c;

-- name: SlotDeleteLapsedAll :many
-- Housekeeping on Citus, where a statement over every shard cannot take
-- row locks with SKIP LOCKED (SlotDeleteLapsed): deletes every lapsed slot
-- in one statement that runs on all shards at once. A row a claimer holds
-- is waited for and judged again under its lock (kept if it was claimed
-- again meanwhile).
WITH gone AS (
    DELETE FROM pglimit.slot WHERE expires_at <= now()
    RETURNING kind
)
SELECT kind, count(*)::bigint AS deleted
FROM gone
GROUP BY kind
ORDER BY kind;

-- Plugin uploads per user in a rolling hour (ADR-0196 decision 5): the same
-- leased slots as heavy_permit.sql, over upload_window. A slot is leased for
-- the whole window and kept after a successful upload, so a user holds at
-- most cap slots in any hour. Read heavy_permit.sql for why each statement is
-- shaped as it is; only the table and lock class differ.

-- name: UploadWindowLockScopes :exec
-- Serialises claimers of the same scopes until their transaction ends. It is
-- queued in the same pgx Batch as UploadWindowClaim: one round trip, one
-- implicit transaction, and the claim's snapshot is taken after the lock, so
-- it sees every slot committed by the claimer before it. Without it two
-- claimers pick the same free slot, the loser's ON CONFLICT ... WHERE finds a
-- live row and it is refused although other slots are free. Locks are taken
-- in one order (by key) so that claimers of two scopes cannot deadlock; the
-- two-key form with a per-table class id keeps clear of the application's
-- own single-key advisory locks.
-- It also turns JIT off for the rest of the transaction: the planner's
-- default row estimates for generate_series and generate_subscripts
-- inflate the claim's cost, and compiling it would cost far more than
-- running it.
SELECT set_config('jit', 'off', true), pg_advisory_xact_lock(1198, k.key)
FROM (
    SELECT DISTINCT hashtext(s.scope) AS key
    FROM unnest(@scopes::text[]) AS s(scope)
    ORDER BY 1
) AS k;

-- name: UploadWindowClaim :many
-- Claims one slot in every wanted scope, or none at all, and reports each
-- scope. A slot is free when no row holds it or its row has lapsed; the
-- lowest free slot of 1..cap is taken with INSERT ... ON CONFLICT DO UPDATE
-- ... WHERE expired, so a lapsed holder is replaced in place and a live one
-- never is. The grant happens only when every scope has a free slot and
-- fewer than cap live holders (a lowered cap is honoured at once). Every
-- wanted scope comes back with its granted slot (0: none), its live holders
-- before the claim, and the milliseconds until the first of them lapses (0
-- if none). Times come from the database clock, never a replica's.
WITH wanted AS (
    SELECT (@scopes::text[])[i] AS scope, (@caps::int[])[i] AS cap, i AS ord
    FROM generate_subscripts(@scopes::text[], 1) AS i
),
live AS (
    -- = ANY on the primary key's first column: an index scan however many
    -- dead rows the churn of claims and releases has left in the table.
    SELECT p.scope, p.slot, p.expires_at
    FROM upload_window AS p
    WHERE p.scope = ANY(@scopes::text[]) AND p.expires_at > now()
),
free AS (
    SELECT w.scope, min(g.slot)::int AS slot
    FROM wanted AS w
    CROSS JOIN LATERAL generate_series(1, w.cap) AS g(slot)
    WHERE NOT EXISTS (SELECT 1 FROM live AS l WHERE l.scope = w.scope AND l.slot = g.slot)
      AND (SELECT count(*) FROM live AS l WHERE l.scope = w.scope) < w.cap
    GROUP BY w.scope
),
granted AS (
    INSERT INTO upload_window AS p (scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
    SELECT f.scope, f.slot, @lease_id::uuid, @holder::text, @endpoint::text, @replica::text,
           now(), now() + interval '1 millisecond' * @lease_ms::bigint
    FROM free AS f
    WHERE (SELECT count(*) FROM free) = (SELECT count(*) FROM wanted)
    ON CONFLICT (scope, slot) DO UPDATE
        SET lease_id = excluded.lease_id, holder = excluded.holder,
            endpoint = excluded.endpoint, replica = excluded.replica,
            claimed_at = excluded.claimed_at, expires_at = excluded.expires_at
        WHERE p.expires_at <= now()
    RETURNING p.scope, p.slot
)
SELECT w.scope::text AS scope,
       w.cap::int AS cap,
       coalesce(g.slot, 0)::int AS granted_slot,
       (SELECT count(*) FROM live AS l WHERE l.scope = w.scope)::int AS live,
       coalesce(ceil(extract(epoch FROM
           (SELECT min(l.expires_at) FROM live AS l WHERE l.scope = w.scope) - now()) * 1000), 0)::bigint AS first_lapse_ms
FROM wanted AS w
LEFT JOIN granted AS g ON g.scope = w.scope
ORDER BY w.ord;

-- name: UploadWindowRelease :execrows
-- Releases every slot one claim took, in one statement. The lease id makes
-- sure a holder whose permit lapsed and was claimed again by someone else
-- never deletes the new holder's row.
DELETE FROM upload_window
WHERE scope = ANY(@scopes::text[]) AND lease_id = @lease_id::uuid;

-- name: UploadWindowList :many
-- The live permits, for the operator view (GET /api/limits).
SELECT scope, slot, holder, endpoint, replica, claimed_at, expires_at
FROM upload_window
WHERE expires_at > now()
ORDER BY scope, slot;

-- name: UploadWindowDeleteLapsed :execrows
-- Housekeeping: deletes at most @batch lapsed rows. SKIP LOCKED leaves rows
-- a claimer is replacing right now to that claimer.
DELETE FROM upload_window
WHERE (scope, slot) IN (
    SELECT scope, slot FROM upload_window
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
);

-- The shares of a rate limit a replica spends in memory (ratelimit's
-- Options.Shares; sql/schema/00013_share.sql says why each step is
-- safe). A claim, a renewal every few seconds and a release at shutdown:
-- a handful of statements a minute per replica and limiter, whatever the
-- requests.

-- name: ShareClaim :one
-- Takes the lowest share of @name among 1..@slots that is free or whose
-- lease lapsed, for @holder, until @lease_ms from now on the database
-- clock. Two claims at once may pick the same share: ON CONFLICT judges
-- the WHERE against the latest committed row, so only one takes it and
-- the other gets no row (it tries again later).
INSERT INTO pglimit.share AS s (name, slot, holder, expires_at)
SELECT @name::text, g, @holder::uuid, now() + interval '1 millisecond' * @lease_ms::bigint
FROM generate_series(1, @slots::int) AS g
WHERE NOT EXISTS (SELECT 1 FROM pglimit.share AS x WHERE x.name = @name::text AND x.slot = g AND x.expires_at > now())
ORDER BY g
LIMIT 1
ON CONFLICT (name, slot) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE s.expires_at <= now()
RETURNING slot;

-- name: ShareRenew :execrows
-- Renews @holder's share @slot of @name for @lease_ms from now, only while
-- its lease still runs: a lapsed share may have been taken, and its
-- holder claims one again (and spends nothing for a lease).
UPDATE pglimit.share
SET expires_at = now() + interval '1 millisecond' * @lease_ms::bigint
WHERE name = @name::text AND slot = @slot::int AND holder = @holder::uuid AND expires_at > now();

-- name: ShareRelease :exec
-- A holder that stops (Flush) gives its share back; whoever takes it next
-- spends nothing for a lease.
DELETE FROM pglimit.share WHERE name = @name::text AND slot = @slot::int AND holder = @holder::uuid;

-- name: ShareList :many
-- The live shares of @name, for tests and the operator.
SELECT slot, holder, expires_at FROM pglimit.share
WHERE name = @name::text AND expires_at > now()
ORDER BY slot;

-- name: ShareHolders :many
-- The holders of @name's shares whose lease runs, or ran out less than
-- @linger_ms ago (a holder's last requests may still run that long), for
-- the claims of a slot limiter with shares (internal/slots): each counts
-- one slot of every scope reserved until it gives the scope up.
SELECT DISTINCT holder FROM pglimit.share
WHERE name = @name::text AND expires_at > now() - interval '1 millisecond' * @linger_ms::bigint;

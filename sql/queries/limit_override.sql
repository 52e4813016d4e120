-- Limits as data (package override): per-key limits of named policies in
-- pglimit.limit_override, kept in every replica's memory.

-- name: OverrideSet :one
-- Sets key's limit under policy (replacing an earlier one), ending @ttl
-- from now on the database clock (NULL: never). The caller tells every
-- replica with BusNotify in the same transaction (see package override).
INSERT INTO pglimit.limit_override AS o (policy, key, "limit", expires_at, updated_at)
VALUES (@policy::text, @key::text, @max_limit::bigint, clock_timestamp() + sqlc.narg(ttl)::interval, clock_timestamp())
ON CONFLICT (policy, key) DO UPDATE SET "limit" = excluded."limit", expires_at = excluded.expires_at, updated_at = excluded.updated_at
RETURNING policy, key, "limit", expires_at, updated_at;

-- name: OverrideDelete :execrows
-- Removes key's override under policy.
DELETE FROM pglimit.limit_override WHERE policy = @policy::text AND key = @key::text;

-- name: OverrideGet :one
-- One key's override, when it has one that has not expired.
SELECT policy, key, "limit", expires_at, updated_at, clock_timestamp()::timestamptz AS now
FROM pglimit.limit_override
WHERE policy = @policy::text AND key = @key::text AND (expires_at IS NULL OR expires_at > clock_timestamp());

-- name: OverrideAll :many
-- Every override that has not expired (what a replica loads), with the
-- database clock to judge the expiries by.
SELECT policy, key, "limit", expires_at, updated_at, clock_timestamp()::timestamptz AS now
FROM pglimit.limit_override
WHERE expires_at IS NULL OR expires_at > clock_timestamp()
ORDER BY policy, key;

-- name: OverrideList :many
-- The overrides of policy after key @after, in key order, at most @max.
SELECT policy, key, "limit", expires_at, updated_at
FROM pglimit.limit_override
WHERE policy = @policy::text AND key > @after::text AND (expires_at IS NULL OR expires_at > clock_timestamp())
ORDER BY key
LIMIT @max::int;

-- The replica registry. Each replica upserts its row on every heartbeat; a
-- row counts as ready while ready is true and its expires_at (the last
-- heartbeat plus three intervals, on the database clock) is in the future.

-- name: ReplicaHeartbeat :one
-- Registers the replica or refreshes its row, and returns the row's
-- started_at. The upsert also re-creates a row lost when a crash of the
-- database emptied this UNLOGGED table; the replica then passes the
-- started_at it was first given, so the row keeps its start (a first
-- registration passes null and gets now()). expires_at is the heartbeat plus
-- @ttl_ms (three intervals), on the database clock.
INSERT INTO pglimit.replica AS r (name, started_at, heartbeat_at, ready, expires_at)
VALUES (@name::text, coalesce(sqlc.narg(started_at)::timestamptz, now()), now(), @ready::boolean,
        now() + interval '1 millisecond' * @ttl_ms::bigint)
ON CONFLICT (name) DO UPDATE SET
    heartbeat_at = now(),
    ready        = excluded.ready,
    expires_at   = excluded.expires_at
RETURNING started_at;

-- name: ReplicaDelete :exec
-- A replica that shuts down removes its row.
DELETE FROM pglimit.replica WHERE name = @name::text;

-- name: ReplicaCountReady :one
-- The number of ready replicas.
SELECT count(*)::int AS ready
FROM pglimit.replica
WHERE ready AND expires_at > now();

-- name: ReplicaList :many
-- Every registered replica, with whether it counts as ready now.
SELECT name, started_at, heartbeat_at, (ready AND expires_at > now())::boolean AS ready, expires_at
FROM pglimit.replica
ORDER BY name;

-- name: ReplicaDeleteLapsed :execrows
-- Housekeeping: deletes at most @batch rows of replicas that stopped
-- heartbeating.
DELETE FROM pglimit.replica
WHERE name IN (
    SELECT name FROM pglimit.replica
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
);

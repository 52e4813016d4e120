-- The invalidation bus (internal/bus): a write that undoes what replicas
-- remember (a reset, a cleared sign-in throttle, a reservation given back)
-- is followed by this notification on the channel pglimit, delivered at
-- its commit to every replica listening. It touches no table, so it runs on
-- the server the replicas listen to (a Citus coordinator, never a worker).

-- name: BusNotify :exec
-- Sends @payload (a topic, a newline, a stored key; or a topic alone) to
-- every listening replica.
SELECT pg_notify('pglimit', @payload::text);

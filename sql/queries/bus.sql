-- The invalidation bus (internal/bus): a write that undoes what replicas
-- remember (a reset, a cleared sign-in throttle, a reservation given back)
-- is followed by this notification on the channel pglimit, delivered at
-- its commit to every replica listening. It runs on the server the
-- replicas listen to (a Citus coordinator, never a worker), and reads
-- only the coordinator's pglimit.bus_key and pglimit.bus_seq.
--
-- Any role that may connect may NOTIFY on the channel and LISTEN to it, so
-- every notification is authenticated (migration 00008): its payload is
-- "<seq> <at> <tag>\n" and then the message (a topic, a newline, a stored
-- key; or a topic alone), where seq is nextval of pglimit.bus_seq, at the
-- database's clock in microseconds since 1970, and tag the hex
-- HMAC-SHA256, under pglimit.bus_key's key, of "<seq> <at> " followed by
-- the message (in UTF-8). The HMAC is computed here, with the built-in
-- sha256() over the key's stored pads, so a writer holds no secret and
-- the time is the database's, the one clock every replica shares. One
-- statement per invalidation, as before: the key's one-row read, a
-- nextval and two sha256 of a few hundred bytes are microseconds.

-- name: BusNotify :exec
-- Sends @payload (a topic, a newline, a stored key; or a topic alone),
-- authenticated, to every listening replica.
SELECT pg_notify('pglimit', m.head || encode(sha256(k.outer_pad || sha256(k.inner_pad || convert_to(m.head || @payload::text, 'UTF8'))), 'hex')
                            || chr(10) || @payload::text)
FROM pglimit.bus_key AS k
CROSS JOIN (SELECT nextval('pglimit.bus_seq') || ' ' || (extract(epoch FROM clock_timestamp()) * 1000000)::bigint || ' ' AS head) AS m;

-- name: BusPing :one
-- The bus's liveness check, on its own listening connection: BusNotify of
-- @payload ("ping", a newline, a nonce), answering the server session it
-- ran in, so that the bus sees a pooler that runs its statements in
-- other sessions than the one that listens.
SELECT pg_backend_pid()::int AS pid
FROM (
    SELECT pg_notify('pglimit', m.head || encode(sha256(k.outer_pad || sha256(k.inner_pad || convert_to(m.head || @payload::text, 'UTF8'))), 'hex')
                                || chr(10) || @payload::text)
    FROM pglimit.bus_key AS k
    CROSS JOIN (SELECT nextval('pglimit.bus_seq') || ' ' || (extract(epoch FROM clock_timestamp()) * 1000000)::bigint || ' ' AS head) AS m
) AS n;

-- name: BusKey :one
-- The bus's key, read when it connects, and the database's clock then (in
-- microseconds since 1970): notifications stamped long before it are
-- stale.
SELECT k.key, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
FROM pglimit.bus_key AS k;

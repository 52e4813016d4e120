-- Demo data, seeded once per database however many replicas start at once.

-- name: SeedLock :exec
-- Serialises seeders until their transaction ends.
SELECT pg_advisory_xact_lock(5317, 1);

-- name: SeedDone :one
-- Whether a data set was seeded already.
SELECT EXISTS (SELECT 1 FROM demo_seed WHERE name = @name::text) AS done;

-- name: SeedMark :exec
INSERT INTO demo_seed (name) VALUES (@name::text) ON CONFLICT DO NOTHING;

-- name: SeedUser :one
-- A demo user, made or brought up to date on every start (the demo
-- operator too, on a database seeded before there were operators).
INSERT INTO app_user (username, password_hash, operator) VALUES (@username::text, @password_hash::text, @operator::boolean)
ON CONFLICT (username) DO UPDATE SET password_hash = excluded.password_hash, operator = excluded.operator
RETURNING id;

-- name: SeedToken :exec
-- A demo token (its name, "demo", is what operators see; the token is
-- "<user>-token", stored as its digest like every token).
INSERT INTO api_token (digest, user_id, name) VALUES (@digest::bytea, @user_id::bigint, @name::text)
ON CONFLICT (digest) DO UPDATE SET name = excluded.name;

-- name: SeedAuditEvents :exec
-- @n audit events, newest now, three to a second so the sort key has ties.
INSERT INTO audit_event (occurred_at, actor, action, target, detail)
SELECT now() - interval '1 second' * (g / 3),
       (ARRAY['alice','bob','carol'])[1 + g % 3],
       (ARRAY['queue.create','queue.delete','address.update','user.login','message.send'])[1 + g % 5],
       'queue-' || (g % 97),
       jsonb_build_object('seq', g)
FROM generate_series(1, @n::int) AS g;

-- name: SeedEvents :exec
INSERT INTO event (occurred_at, source, kind, message)
SELECT now() - interval '1 second' * (g / 2),
       'broker-' || (1 + g % 3),
       (ARRAY['connection.open','connection.close','consumer.add','consumer.remove'])[1 + g % 4],
       'event ' || g
FROM generate_series(1, @n::int) AS g;

-- name: SeedAlerts :exec
INSERT INTO alert (occurred_at, severity, name, message)
SELECT now() - interval '1 minute' * g,
       (ARRAY['info','warning','critical'])[1 + g % 3],
       'alert-' || (g % 50),
       'threshold crossed on queue-' || (g % 97)
FROM generate_series(1, @n::int) AS g;

-- name: SeedMessageFlow :exec
INSERT INTO message_flow (occurred_at, source_address, target_address, messages)
SELECT now() - interval '1 minute' * g,
       'address-' || (g % 12),
       'address-' || ((g * 7 + 3) % 12),
       1 + (g * 37) % 500
FROM generate_series(1, @n::int) AS g;

-- name: SeedNumberedUsers :exec
-- With -demo-users: @n more demo users user00001, user00002, … (password
-- as the demo's, one bcrypt hash for all, so that seeding thousands of
-- users takes a statement and not minutes of hashing), each with the token
-- <user>-token stored as its SHA-256 digest (TokenDigest) like every
-- token. Two statements in one; users and tokens already there are kept.
WITH made AS (
    INSERT INTO app_user (username, password_hash, operator)
    SELECT 'user' || lpad(g::text, 5, '0'), @password_hash::text, false
    FROM generate_series(1, @n::int) AS g
    ON CONFLICT (username) DO UPDATE SET password_hash = excluded.password_hash
    RETURNING id, username
)
INSERT INTO api_token (digest, user_id, name)
SELECT sha256(convert_to(made.username || '-token', 'UTF8')), made.id, 'demo'
FROM made
ON CONFLICT (digest) DO NOTHING;

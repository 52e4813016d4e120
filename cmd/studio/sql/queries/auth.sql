-- Users and API tokens.

-- name: AppUserByName :one
-- The user signing in, by normalised username.
SELECT id, username, password_hash FROM app_user WHERE username = @username::text;

-- name: ApiTokenLookup :one
-- The user a bearer token belongs to, by the token's SHA-256 digest, and
-- whether that user is an operator.
SELECT t.id AS token_id, t.name AS token_name, u.id AS user_id, u.username, u.operator
FROM api_token AS t
JOIN app_user AS u ON u.id = t.user_id
WHERE t.digest = @digest::bytea AND (t.expires_at IS NULL OR t.expires_at > now());

-- name: ApiTokenCreate :one
-- A session token issued by a successful sign-in.
INSERT INTO api_token (digest, user_id, name, expires_at)
VALUES (@digest::bytea, @user_id::bigint, @name::text, now() + interval '1 millisecond' * @ttl_ms::bigint)
RETURNING id;

-- name: ApiTokenNames :many
-- The names and owners of tokens by id, for the operator page (the
-- in-flight cap counts token ids; a token's secret is never stored).
SELECT t.id, t.name, u.username
FROM api_token AS t
JOIN app_user AS u ON u.id = t.user_id
WHERE t.id = ANY (@ids::bigint[]);

-- name: DeviceCookieKeys :many
-- The keys of the sign-in throttle's device cookies, newest first: the
-- first signs, all verify (middleware/signin's DeviceOptions.Keys). Read
-- once at start-up.
SELECT key FROM device_cookie_key ORDER BY id DESC LIMIT 8;

-- name: PluginCreate :one
-- Stores a plugin unless the user already stored the same content (the
-- unique index plugin_user_sha256): a duplicate inserts nothing and returns
-- no row. A concurrent upload of the same content by the same user waits
-- here for the first one's transaction, then returns no row when it
-- committed. It runs in the transaction that also debits the user's plugin
-- bytes, so the plugin and its charge commit or roll back together.
INSERT INTO plugin (user_id, name, size, sha256, content)
VALUES (@user_id::bigint, @name::text, @size::bigint, @sha256::text, @content::bytea)
ON CONFLICT (user_id, sha256) DO NOTHING
RETURNING id;


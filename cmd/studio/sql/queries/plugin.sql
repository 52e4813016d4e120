-- name: PluginCreate :one
INSERT INTO plugin (user_id, name, size, sha256, content)
VALUES (@user_id::bigint, @name::text, @size::bigint, @sha256::text, @content::bytea)
RETURNING id;

-- +goose Up
-- A plugin is stored once per user and content (issue 31): a second upload
-- of the same bytes is 409 duplicate-plugin and charges nothing to the
-- user's monthly plugin bytes. Two replicas storing one content at once
-- meet on this index: the second insert waits for the first transaction
-- and then inserts nothing. Copies stored before this migration are
-- removed, the first of each kept.
DELETE FROM plugin p
USING plugin q
WHERE p.user_id = q.user_id AND p.sha256 = q.sha256 AND p.id > q.id;

CREATE UNIQUE INDEX plugin_user_sha256 ON plugin (user_id, sha256);

-- +goose Down
DROP INDEX plugin_user_sha256;

-- pglimit's own schema.

-- name: SchemaCreate :exec
-- Creates the schema pglimit before goose runs: goose keeps pglimit's
-- version table (pglimit.goose_db_version) in it, and does not create a
-- schema itself. The first migration says the same, for completeness.
CREATE SCHEMA IF NOT EXISTS pglimit;

-- name: SchemaOnCitus :one
-- Whether the database is a Citus cluster's (the extension citus is
-- installed): pglimit.Migrate has then distributed the limit tables, and
-- the limiters decide with the functions that run on a key's shard.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS on_citus;

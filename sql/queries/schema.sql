-- pglimit's own schema.

-- name: SchemaCreate :exec
-- Creates the schema pglimit before goose runs: goose keeps pglimit's
-- version table (pglimit.goose_db_version) in it, and does not create a
-- schema itself. The first migration says the same, for completeness.
CREATE SCHEMA IF NOT EXISTS pglimit;

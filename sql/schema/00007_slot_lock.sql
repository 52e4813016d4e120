-- +goose Up

-- slot_lock: the rows claims of one scope take turns on when they are
-- judged under the scope lock (SlotLockScopes in sql/queries/slot.sql).
-- They took turns on transaction-scoped advisory locks before, which any
-- role that may connect to the database can take as well (pg_advisory_lock
-- needs no grant): a database user of the host's holding the key of the
-- installation's scope stalled every heavy claim of the installation until
-- its Timeout. A row lock on a table of the schema pglimit can be taken
-- only by a role that may update it (INSERT ... ON CONFLICT DO UPDATE
-- needs INSERT and UPDATE on it, SELECT ... FOR UPDATE or FOR SHARE needs
-- UPDATE, and every other role has no USAGE on the schema to begin with).
-- So grant nothing on it: even REFERENCES would let a role's foreign key
-- take FOR KEY SHARE locks on its rows, which a claim's lock waits for.
--
-- One row per bucket of the scopes' hashes (hashtext(kind:scope) & 4095):
-- two scopes of one bucket only take turns, as two scopes whose hashes
-- collided did. The claim inserts a missing bucket itself (ON CONFLICT DO
-- UPDATE ... WHERE false locks the row it finds without writing it), so
-- the table may be UNLOGGED like the others (a crash empties it; the next
-- claims fill it again) and its row locks write no WAL. It holds 4,096
-- rows of one integer at most.
CREATE UNLOGGED TABLE pglimit.slot_lock (
    bucket integer NOT NULL PRIMARY KEY CHECK (bucket BETWEEN 0 AND 4095)
);
REVOKE ALL ON pglimit.slot_lock FROM PUBLIC;

-- +goose Down
DROP TABLE pglimit.slot_lock;

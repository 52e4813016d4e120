-- +goose Up

-- pglimit.slot becomes one plain UNLOGGED table, and heavy_permit,
-- request_in_flight and upload_window become views of it, one per kind,
-- showing the live slots (what operators read).
--
-- Why not partitions any more (measured, pg_stat_statements, PostgreSQL
-- 15): an INSERT ... ON CONFLICT through the partitioned parent routes each
-- row to its partition and sets the partition up for ON CONFLICT on every
-- execution — 51 µs for a one-row insert against 22 µs for the same insert
-- into a plain table with the same indexes — and a statement on the parent
-- costs hundreds of microseconds to plan. A claim is that insert; it was
-- most of a claim's time in the database.
--
-- Why no index on expires_at any more: a release now marks its row lapsed
-- (UPDATE ... SET expires_at = now()) instead of deleting it, and the next
-- claim of that slot replaces the lapsed row in place (ON CONFLICT DO
-- UPDATE ... WHERE expired). With no index on a column those statements
-- change, both are HOT updates: no index entry written, the old version
-- pruned in place, so a scope's claims and releases churn one row per slot
-- instead of a new row version, two index entries and a dead tuple each.
-- Housekeeping finds lapsed rows with a sequential scan instead, once per
-- sweep (every minute, one replica at a time); the table holds the live
-- slots and the lapsed ones not yet swept, a few rows per active scope.
-- fillfactor leaves room on each page for the new versions.
CREATE UNLOGGED TABLE pglimit.slot_next (
    kind       text        NOT NULL,
    scope      text        NOT NULL,
    slot       integer     NOT NULL CHECK (slot >= 1),
    lease_id   uuid        NOT NULL,
    holder     text        NOT NULL,
    endpoint   text        NOT NULL,
    replica    text        NOT NULL,
    claimed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (kind, scope, slot)
) WITH (fillfactor = 70);

-- The live slots stay held across the migration (replicas of the previous
-- version release them by lease id, as this one does).
INSERT INTO pglimit.slot_next
SELECT kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at
FROM pglimit.slot
WHERE expires_at > now();

DROP TABLE pglimit.heavy_permit, pglimit.request_in_flight, pglimit.upload_window;
DROP TABLE pglimit.slot;
ALTER TABLE pglimit.slot_next RENAME TO slot;
ALTER INDEX pglimit.slot_next_pkey RENAME TO slot_pkey;
ALTER TABLE pglimit.slot SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);

-- One view per kind, under the table name ADR-0196 gives it: the slots
-- held now. A fourth kind of slot is one constant of package permit (and a
-- view here for operators).
CREATE VIEW pglimit.heavy_permit AS
SELECT kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at
FROM pglimit.slot
WHERE kind = 'heavy_permit' AND expires_at > now();

CREATE VIEW pglimit.request_in_flight AS
SELECT kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at
FROM pglimit.slot
WHERE kind = 'request_in_flight' AND expires_at > now();

CREATE VIEW pglimit.upload_window AS
SELECT kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at
FROM pglimit.slot
WHERE kind = 'upload_window' AND expires_at > now();

-- +goose Down
DROP VIEW pglimit.heavy_permit, pglimit.request_in_flight, pglimit.upload_window;
ALTER TABLE pglimit.slot RENAME TO slot_plain;
ALTER INDEX pglimit.slot_pkey RENAME TO slot_plain_pkey;
CREATE UNLOGGED TABLE pglimit.slot (
    kind       text        NOT NULL,
    scope      text        NOT NULL,
    slot       integer     NOT NULL CHECK (slot >= 1),
    lease_id   uuid        NOT NULL,
    holder     text        NOT NULL,
    endpoint   text        NOT NULL,
    replica    text        NOT NULL,
    claimed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (kind, scope, slot)
) PARTITION BY LIST (kind);
CREATE INDEX slot_expires_at ON pglimit.slot (expires_at);
CREATE UNLOGGED TABLE pglimit.heavy_permit PARTITION OF pglimit.slot FOR VALUES IN ('heavy_permit');
CREATE UNLOGGED TABLE pglimit.request_in_flight PARTITION OF pglimit.slot FOR VALUES IN ('request_in_flight');
CREATE UNLOGGED TABLE pglimit.upload_window PARTITION OF pglimit.slot FOR VALUES IN ('upload_window');
ALTER TABLE pglimit.heavy_permit      SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pglimit.request_in_flight SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pglimit.upload_window     SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
INSERT INTO pglimit.slot
SELECT kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at
FROM pglimit.slot_plain
WHERE expires_at > now() AND kind IN ('heavy_permit', 'request_in_flight', 'upload_window');
DROP TABLE pglimit.slot_plain;

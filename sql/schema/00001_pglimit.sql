-- +goose Up

-- pglimit keeps every table of its own in the schema pglimit, so that it
-- never meets a table of the service it runs in (a service may well have a
-- "replica" or "login_attempt" table of its own). schema.Migrate creates the
-- schema before goose runs, because goose's version table for pglimit
-- (pglimit.goose_db_version) lives in it too; the statement here makes the
-- folder complete for anyone who applies it another way.
CREATE SCHEMA IF NOT EXISTS pglimit;

-- An installation migrated before pglimit had a schema of its own has the
-- tables below in its default schema, with their version table
-- public.pglimit_schema_version. Only then are they dropped: their contents
-- are UNLOGGED permits, counters and heartbeats, lost on any crash anyway,
-- and the limits restart from zero, the safe direction for a permit (a
-- sign-in throttle starts its window again). A service's own tables of the
-- same names, with no pglimit version table beside them, are never touched.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('public.pglimit_schema_version') IS NOT NULL THEN
        DROP TABLE IF EXISTS public.heavy_permit, public.request_in_flight, public.upload_window,
                             public.login_attempt, public.replica;
        DROP TABLE public.pglimit_schema_version;
    END IF;
END
$$;
-- +goose StatementEnd

-- Every table here is UNLOGGED: writes skip the WAL, so a claim costs little,
-- and a crash of the database empties the tables. Limits then restart from
-- zero, which is the safe direction for a permit (ADR-0196, Consequences).
-- Every row carries expires_at, the database-clock time at which it lapses on
-- its own; housekeeping deletes lapsed rows through the expires_at index.

-- slot: leased slots, the one mechanism under heavy permits, the in-flight
-- cap and the upload window (package permit). One row per held slot; a slot
-- number is 1..cap of its scope, so the primary key itself forbids two
-- holders of one slot. The statements (sql/queries/slot.sql) run on this
-- parent with the kind as a parameter; each kind is a partition of its own,
-- under the table name ADR-0196 gives it, which operators query directly.
-- A fourth kind of slot is one more partition (a migration) and one constant
-- of package permit.
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

-- heavy_permit: heavy endpoints (ADR-0196 decisions 1 and 2). scope is
-- 'user:<endpoint>:<user>' (the per-user cap) or 'installation' (the cap over
-- all heavy requests of all replicas).
CREATE UNLOGGED TABLE pglimit.heavy_permit PARTITION OF pglimit.slot FOR VALUES IN ('heavy_permit');
-- request_in_flight: requests running under an API token, across replicas
-- (scope 'token:<token id>').
CREATE UNLOGGED TABLE pglimit.request_in_flight PARTITION OF pglimit.slot FOR VALUES IN ('request_in_flight');
-- upload_window: uploads counted in a user's rolling window. A slot is held
-- for the whole window after the upload, so at most cap uploads fall in any
-- window; the oldest slot's expires_at is when the next upload may start.
CREATE UNLOGGED TABLE pglimit.upload_window PARTITION OF pglimit.slot FOR VALUES IN ('upload_window');

-- login_attempt: failed sign-ins of one client key (by default the
-- normalised username) in the window that began with the first failure.
CREATE UNLOGGED TABLE pglimit.login_attempt (
    key        text        NOT NULL PRIMARY KEY,
    failures   integer     NOT NULL CHECK (failures >= 0),
    first_at   timestamptz NOT NULL,
    last_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX login_attempt_expires_at ON pglimit.login_attempt (expires_at);

-- replica: the registry of running replicas. A replica heartbeats its row; a
-- row whose expires_at (last heartbeat + three intervals) has passed is not
-- ready, and housekeeping removes it.
CREATE UNLOGGED TABLE pglimit.replica (
    name         text        NOT NULL PRIMARY KEY,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    ready        boolean     NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX replica_expires_at ON pglimit.replica (expires_at);

-- Every claim inserts a row and every release deletes it: the limit tables
-- churn like a queue while holding few live rows. Vacuum them after a fixed
-- number of dead rows instead of a fraction of the table, so scans of a
-- small table never wade through a large one's worth of dead tuples. (A
-- partitioned parent holds no rows and takes no storage parameters: they
-- are set on each partition.)
ALTER TABLE pglimit.heavy_permit      SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pglimit.request_in_flight SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pglimit.upload_window     SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pglimit.login_attempt     SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);

-- +goose Down
-- The schema itself stays: goose's version table for pglimit is in it.
DROP TABLE pglimit.replica;
DROP TABLE pglimit.login_attempt;
DROP TABLE pglimit.slot;

-- The limit tables as pglimit created them in the default schema before it
-- had a schema of its own (migrations 00001 and 00002 of that time), for
-- TestLegacyTablesAreMovedForward.

-- Every table here is UNLOGGED: writes skip the WAL, so a claim costs little,
-- and a crash of the database empties the tables. Limits then restart from
-- zero, which is the safe direction for a permit (ADR-0196, Consequences).
-- Every row carries expires_at, the database-clock time at which it lapses on
-- its own; housekeeping deletes lapsed rows through the expires_at index.

-- heavy_permit: one row per held slot of a heavy endpoint. scope is either
-- 'user:<endpoint>:<user>' (the per-user cap) or 'installation' (the cap over
-- all heavy requests of all replicas). A slot number is 1..cap, so the primary
-- key itself forbids two holders of one slot.
CREATE UNLOGGED TABLE heavy_permit (
    scope      text        NOT NULL,
    slot       integer     NOT NULL CHECK (slot >= 1),
    lease_id   uuid        NOT NULL,
    holder     text        NOT NULL,
    endpoint   text        NOT NULL,
    replica    text        NOT NULL,
    claimed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (scope, slot)
);
CREATE INDEX heavy_permit_expires_at ON heavy_permit (expires_at);

-- request_in_flight: one row per request running under an API token, across
-- replicas; same shape as heavy_permit (scope = 'token:<token id>').
CREATE UNLOGGED TABLE request_in_flight (
    scope      text        NOT NULL,
    slot       integer     NOT NULL CHECK (slot >= 1),
    lease_id   uuid        NOT NULL,
    holder     text        NOT NULL,
    endpoint   text        NOT NULL,
    replica    text        NOT NULL,
    claimed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (scope, slot)
);
CREATE INDEX request_in_flight_expires_at ON request_in_flight (expires_at);

-- upload_window: one row per upload counted in a user's rolling hour. A slot
-- is held for the whole window after the upload, so at most cap uploads fall
-- in any hour; the oldest slot's expires_at is when the next upload may start.
CREATE UNLOGGED TABLE upload_window (
    scope      text        NOT NULL,
    slot       integer     NOT NULL CHECK (slot >= 1),
    lease_id   uuid        NOT NULL,
    holder     text        NOT NULL,
    endpoint   text        NOT NULL,
    replica    text        NOT NULL,
    claimed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (scope, slot)
);
CREATE INDEX upload_window_expires_at ON upload_window (expires_at);

-- login_attempt: failed sign-ins of one client key (by default the
-- normalised username) in the window that began with the first failure.
CREATE UNLOGGED TABLE login_attempt (
    key        text        NOT NULL PRIMARY KEY,
    failures   integer     NOT NULL CHECK (failures >= 0),
    first_at   timestamptz NOT NULL,
    last_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX login_attempt_expires_at ON login_attempt (expires_at);

-- replica: the registry of running replicas. A replica heartbeats its row; a
-- row whose expires_at (last heartbeat + three intervals) has passed is not
-- ready, and housekeeping removes it.
CREATE UNLOGGED TABLE replica (
    name         text        NOT NULL PRIMARY KEY,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    ready        boolean     NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX replica_expires_at ON replica (expires_at);

-- goose's version table as pglimit kept it before it had a schema of its own.
CREATE TABLE pglimit_schema_version (id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now());
INSERT INTO pglimit_schema_version (version_id, is_applied) VALUES (0, true), (1, true), (2, true);
INSERT INTO heavy_permit VALUES ('installation', 1, gen_random_uuid(), 'alice', 'sql-console', 'r1', now(), now() + interval '1 minute');
-- A table of the service's own that must stay.
CREATE TABLE unrelated (id int);

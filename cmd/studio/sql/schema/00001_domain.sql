-- +goose Up

-- The reference service's own domain. pglimit's limit tables come from
-- pglimit's migrations (sql/schema at the repository root); these are the
-- things a broker console keeps.

CREATE TABLE app_user (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    username      text        NOT NULL UNIQUE,
    password_hash text        NOT NULL, -- bcrypt
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- API tokens are stored as SHA-256 digests: a leaked table reveals no
-- token. The id, not the token, names a token in limits and logs.
CREATE TABLE api_token (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    digest     bytea       NOT NULL UNIQUE,
    user_id    bigint      NOT NULL REFERENCES app_user (id) ON DELETE CASCADE,
    name       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz
);

-- History tables are read newest first and paged by key: the
-- (occurred_at, id) index serves both the page and the cursor predicate.
CREATE TABLE audit_event (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    occurred_at timestamptz NOT NULL,
    actor       text        NOT NULL,
    action      text        NOT NULL,
    target      text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_event_keyset ON audit_event (occurred_at, id);

CREATE TABLE event (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    occurred_at timestamptz NOT NULL,
    source      text        NOT NULL,
    kind        text        NOT NULL,
    message     text        NOT NULL
);
CREATE INDEX event_keyset ON event (occurred_at, id);

CREATE TABLE alert (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    occurred_at timestamptz NOT NULL,
    severity    text        NOT NULL,
    name        text        NOT NULL,
    message     text        NOT NULL
);
CREATE INDEX alert_keyset ON alert (occurred_at, id);

-- Message counts between addresses, summed into the flow graph.
CREATE TABLE message_flow (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    occurred_at    timestamptz NOT NULL,
    source_address text        NOT NULL,
    target_address text        NOT NULL,
    messages       bigint      NOT NULL
);

CREATE TABLE plugin (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id     bigint      NOT NULL REFERENCES app_user (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    size        bigint      NOT NULL,
    sha256      text        NOT NULL,
    content     bytea       NOT NULL,
    uploaded_at timestamptz NOT NULL DEFAULT now()
);

-- One row per demo data set already seeded, so seeding is idempotent.
CREATE TABLE demo_seed (
    name      text        PRIMARY KEY,
    seeded_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE demo_seed;
DROP TABLE plugin;
DROP TABLE message_flow;
DROP TABLE alert;
DROP TABLE event;
DROP TABLE audit_event;
DROP TABLE api_token;
DROP TABLE app_user;

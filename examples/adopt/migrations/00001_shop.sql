-- The service's own schema, as it was before pglimit: its users, their API
-- tokens and orders, and two tables whose names pglimit's also uses —
-- login_attempt (here an audit of every password check, not a throttle)
-- and replica (the instances that started, for the team's dashboard).
-- pglimit keeps its tables in a schema of its own, so both live side by
-- side, and so do the two goose histories (public.goose_db_version here,
-- pglimit.goose_db_version for pglimit).

-- +goose Up
CREATE TABLE app_user (
    id            bigserial PRIMARY KEY,
    username      text NOT NULL UNIQUE,
    password_hash bytea NOT NULL
);

CREATE TABLE api_token (
    token_sha256 bytea PRIMARY KEY,
    user_id      bigint NOT NULL REFERENCES app_user (id),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE orders (
    id           bigserial PRIMARY KEY,
    user_id      bigint NOT NULL REFERENCES app_user (id),
    item         text NOT NULL,
    amount_cents bigint NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orders_user_id ON orders (user_id, id);

-- Every password check, kept for the audit.
CREATE TABLE login_attempt (
    id        bigserial PRIMARY KEY,
    username  text NOT NULL,
    succeeded boolean NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
);

-- The instances that started, for the team's dashboard.
CREATE TABLE replica (
    name       text PRIMARY KEY,
    version    text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE replica, login_attempt, orders, api_token, app_user;

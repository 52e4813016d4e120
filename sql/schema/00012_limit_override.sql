-- +goose Up

-- limit_override: a per-key limit for a named policy (package override),
-- what a plan change or a customer's contract sets while the service runs.
-- LOGGED, unlike the limit tables: it is configuration an operator wrote,
-- and a crash must not hand every customer the default back. One row per
-- (policy, key); expires_at, optional, ends an override on its own (a
-- trial's higher limit). Every replica keeps the table in memory and
-- learns of a change through the invalidation bus (topic "override/"), so
-- reading a key's limit costs no statement.
CREATE TABLE pglimit.limit_override (
    policy     text        NOT NULL CHECK (length(policy) BETWEEN 1 AND 200),
    key        text        NOT NULL CHECK (length(key) BETWEEN 1 AND 1000),
    "limit"    bigint      NOT NULL CHECK ("limit" >= 0),
    expires_at timestamptz,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (policy, key)
);

-- +goose Down
DROP TABLE pglimit.limit_override;

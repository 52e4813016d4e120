-- +goose Up

-- access_rule: the allow and deny lists (package access), as data. One row
-- per rule: list is 'allow' or 'deny'; match is what the rule matches, in
-- the form package access checked and normalised before writing it — an
-- IPv4 or IPv6 prefix ("192.0.2.0/24", "2001:db8::/48"; a single address
-- is its full-length prefix) or a key ("user:alice", "token:42");
-- expires_at is when it stops matching, on the database clock, or NULL
-- for never. A rule is changed by inserting or deleting its row, each
-- followed by a notification on the invalidation bus (topic "access") in
-- the same transaction, so every replica reloads the lists within about a
-- second of the commit.
--
-- Unlike the limit tables it is LOGGED: the rules are configuration an
-- operator wrote, and a crash of the database must not lift a deny list.
-- It is small (each replica reads it whole on every reload), so it has no
-- index but its key; a lapsed rule is never loaded again, and
-- housekeeping deletes it (AccessRuleDeleteLapsed; GET lists only the
-- rules in force).
-- (Number 00010: 00009 is taken by the ban table of another branch.)
CREATE TABLE pglimit.access_rule (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list       text        NOT NULL CHECK (list IN ('allow', 'deny')),
    match      text        NOT NULL CHECK (length(match) BETWEEN 1 AND 300),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz
);

-- +goose Down
DROP TABLE pglimit.access_rule;

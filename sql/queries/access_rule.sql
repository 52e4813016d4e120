-- The allow and deny lists (package access) in pglimit.access_rule. A
-- replica holds every rule in force in memory and matches requests there
-- with no statement; these statements change the rules and reload them.
-- Every change is followed, in the same transaction, by BusNotify of the
-- topic "access", so every replica reloads within about a second of the
-- commit (the notification is delivered at commit, after the row is
-- visible).

-- name: AccessRuleAdd :one
-- Adds one rule, already checked and normalised by package access.
-- expires_in_us is its lifetime in microseconds from now on the database
-- clock, or 0 for a rule that never lapses.
INSERT INTO pglimit.access_rule (list, match, expires_at)
VALUES (@list_name::text, @rule_match::text,
        now() + interval '1 microsecond' * nullif(@expires_in_us::bigint, 0))
RETURNING id, list, match, created_at, expires_at;

-- name: AccessRuleRemove :execrows
-- Removes one rule by its id; 0 rows when there is none.
DELETE FROM pglimit.access_rule WHERE id = @id::bigint;

-- name: AccessRuleLive :many
-- Every rule in force now, in the order added, and the database's clock
-- (the same for every row) by which a replica times their expiry. The
-- whole table is read: it is configuration, small, and each replica reads
-- it on a change, when its bus connects again, and once a second while
-- there is no bus.
SELECT id, list, match, created_at, expires_at, clock_timestamp()::timestamptz AS now
FROM pglimit.access_rule
WHERE expires_at IS NULL OR expires_at > now()
ORDER BY id;

-- name: AccessRuleDeleteLapsed :execrows
-- Housekeeping: deletes at most @batch rules whose expiry has passed. A
-- lapsed rule is in force nowhere already (AccessRuleLive never loads it,
-- and a replica stops matching it at its expiry without a reload), so the
-- delete changes no decision and notifies no replica: it only keeps the
-- table, which every replica reads whole on each reload, from growing
-- with rules that will never match again. The table is small and
-- unindexed but for its key: the sweep reads it whole, as a reload does.
DELETE FROM pglimit.access_rule
WHERE id IN (
    SELECT id FROM pglimit.access_rule
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
);

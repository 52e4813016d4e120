-- Calendar quotas (package quota) on pglimit.quota_ledger (LOGGED): the
-- statements of sql/queries/quota_usage.sql, which explains them, on the
-- table whose charges survive a crash and can commit with the caller's
-- own transaction. sqlc cannot take a table name as a parameter; quota's
-- TestLedgerStatementsMirrorUsage keeps the two files equal but for it.
--
-- The period is computed on the database clock, in the limiter's time
-- zone (@zone, an IANA name), as the calendar unit (@unit: day, month or
-- year) that holds it: its start is date_trunc of the local time taken
-- back to an instant, its end the local start plus one @step ('1 day',
-- '1 month', '1 year') taken back to an instant — so a day of a
-- daylight-saving change has 23 or 25 hours and a month its own length.
-- @at, NULL but in tests, stands in for the clock.

-- name: QuotaLedgerCharge :one
-- Charges @cost to the key in the current period when it fits in @quota
-- (used + cost <= quota), else charges nothing; one statement, the row
-- lock of ON CONFLICT serialising two replicas charging one key. A row of
-- an earlier period counts as nothing used; a row already in a later
-- period than this statement's clock (a decision stamped after this one
-- but locked before it) keeps its period and counts this charge in it.
-- Returns the decision, the key's use after it and the period.
WITH request AS (
    SELECT @cost::bigint AS cost, @quota::bigint AS quota,
           coalesce(sqlc.narg(at)::timestamptz, clock_timestamp()) AS at,
           @zone::text AS zone, @unit::text AS unit, @step::interval AS step
), period AS (
    SELECT r.cost, r.quota, r.at,
           date_trunc(r.unit, r.at AT TIME ZONE r.zone) AT TIME ZONE r.zone AS period_start,
           (date_trunc(r.unit, r.at AT TIME ZONE r.zone) + r.step) AT TIME ZONE r.zone AS period_end
    FROM request AS r
)
INSERT INTO pglimit.quota_ledger AS q (name, key, period_start, period_end, used, allowed, decided_at)
SELECT @name::text, @key::text, p.period_start, p.period_end,
       CASE WHEN p.cost <= p.quota THEN p.cost ELSE 0 END, p.cost <= p.quota, p.at
FROM period AS p
ON CONFLICT (name, key) DO UPDATE SET (period_start, period_end, used, allowed, decided_at) = (
    SELECT x.period_start, x.period_end,
           CASE WHEN x.base + p.cost <= p.quota THEN x.base + p.cost ELSE x.base END,
           x.base + p.cost <= p.quota, p.at
    FROM period AS p
    CROSS JOIN LATERAL (
        SELECT CASE WHEN q.period_start >= p.period_start THEN q.used ELSE 0 END AS base,
               greatest(q.period_start, p.period_start) AS period_start,
               CASE WHEN q.period_start >= p.period_start THEN q.period_end ELSE p.period_end END AS period_end
    ) AS x
)
RETURNING allowed, used, period_start, period_end, decided_at;

-- name: QuotaLedgerSettle :one
-- Adds @delta (negative: a refund) to what the key used in the period
-- that starts at @period_start, never below zero, and whatever the quota:
-- the work was done. A period that has ended (the row moved on or lapsed)
-- is left alone: no row.
UPDATE pglimit.quota_ledger
SET used = greatest(used + @delta::bigint, 0)
WHERE name = @name::text AND key = @key::text AND period_start = @period_start::timestamptz
RETURNING used, period_start, period_end;

-- name: QuotaLedgerPeek :one
-- What the key used in the current period, and the period, without
-- charging anything (0 when it has no row of this period).
WITH request AS (
    SELECT coalesce(sqlc.narg(at)::timestamptz, clock_timestamp()) AS at,
           @zone::text AS zone, @unit::text AS unit, @step::interval AS step
), period AS (
    SELECT r.at,
           date_trunc(r.unit, r.at AT TIME ZONE r.zone) AT TIME ZONE r.zone AS period_start,
           (date_trunc(r.unit, r.at AT TIME ZONE r.zone) + r.step) AT TIME ZONE r.zone AS period_end
    FROM request AS r
)
SELECT p.period_start::timestamptz AS period_start, p.period_end::timestamptz AS period_end, p.at::timestamptz AS at,
       coalesce((SELECT q.used FROM pglimit.quota_ledger AS q
                 WHERE q.name = @name::text AND q.key = @key::text AND q.period_start >= p.period_start), 0)::bigint AS used
FROM period AS p;

-- name: QuotaLedgerKeys :many
-- The keys with use in the current period, in key order after @after, at
-- most @max of them.
WITH request AS (
    SELECT coalesce(sqlc.narg(at)::timestamptz, clock_timestamp()) AS at,
           @zone::text AS zone, @unit::text AS unit
), period AS (
    SELECT date_trunc(r.unit, r.at AT TIME ZONE r.zone) AT TIME ZONE r.zone AS period_start
    FROM request AS r
)
SELECT q.key, q.used, q.period_start, q.period_end
FROM pglimit.quota_ledger AS q, period AS p
WHERE q.name = @name::text AND q.key > @after::text AND q.period_start >= p.period_start
ORDER BY q.key
LIMIT @max::int;

-- name: QuotaLedgerReset :execrows
-- Forgets what the key used (its period starts again from nothing).
DELETE FROM pglimit.quota_ledger WHERE name = @name::text AND key = @key::text;

-- name: QuotaLedgerDeleteLapsed :execrows
-- Housekeeping: deletes at most @batch rows whose period has ended (such
-- a row says no more than no row).
DELETE FROM pglimit.quota_ledger
WHERE (name, key) IN (
    SELECT name, key FROM pglimit.quota_ledger
    WHERE period_end <= now()
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
);

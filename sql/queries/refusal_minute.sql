-- Refusals per limit and minute, for the installation's operator view
-- (internal/observe writes them, pglimit.Refusals reads them). A refusal
-- is counted in memory and added here in batches, at most about once a
-- second per limiter and replica while it refuses: a granted request never
-- writes here.

-- name: RefusalMinuteAdd :exec
-- Adds @refusals refusals of the limit @name (made in dry run or not) to
-- the current minute of the database clock. Concurrent adds of replicas
-- serialise on the row lock ON CONFLICT takes, so none is lost.
INSERT INTO pglimit.refusal_minute AS r (name, minute, dry_run, refusals, expires_at)
VALUES (@name::text, date_trunc('minute', now()), @dry_run::boolean, @refusals::bigint,
        date_trunc('minute', now()) + interval '1 hour')
ON CONFLICT (name, minute, dry_run) DO UPDATE SET refusals = r.refusals + excluded.refusals;

-- name: RefusalMinuteRecent :many
-- The refusals of every limit in the last @minutes minutes of the database
-- clock, the current minute included, by limit and minute, and that
-- current minute (the chart's right edge, on the same clock as the rows).
-- The LEFT JOIN from a single row makes the answer one row with a null
-- name when nothing was refused, so the current minute always comes back.
SELECT date_trunc('minute', now())::timestamptz AS current_minute,
       r.name, r.minute, r.dry_run, r.refusals
FROM (SELECT 1) AS one
LEFT JOIN pglimit.refusal_minute AS r
       ON r.minute > date_trunc('minute', now()) - interval '1 minute' * @minutes::int
ORDER BY r.name, r.minute, r.dry_run;

-- name: RefusalMinuteDeleteLapsed :execrows
-- Housekeeping: deletes at most @batch lapsed rows.
DELETE FROM pglimit.refusal_minute
WHERE (name, minute, dry_run) IN (
    SELECT name, minute, dry_run FROM pglimit.refusal_minute
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
);

-- History reads: newest first, a page by number within the first rows, or
-- a page after a keyset cursor at any depth. The cursor predicate
-- (occurred_at, id) < (@at, @id) is a range scan of the (occurred_at, id)
-- index, so a page costs the same at any depth; OFFSET reads and throws
-- away every row before the page. The count is capped: it reads at most
-- @cap rows, which is all page mode can reach.

-- name: AuditEventPage :many
SELECT id, occurred_at, actor, action, target, detail
FROM audit_event
WHERE occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
ORDER BY occurred_at DESC, id DESC
LIMIT @size::int OFFSET @skip::int;

-- name: AuditEventPageAfter :many
SELECT id, occurred_at, actor, action, target, detail
FROM audit_event
WHERE (occurred_at, id) < (@at::timestamptz, @id::bigint)
  AND occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
ORDER BY occurred_at DESC, id DESC
LIMIT @size::int;

-- name: AuditEventCount :one
SELECT count(*)::int AS total
FROM (SELECT 1 FROM audit_event
      WHERE occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
      LIMIT @cap::int) AS capped;

-- name: EventPage :many
SELECT id, occurred_at, source, kind, message
FROM event
WHERE occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
ORDER BY occurred_at DESC, id DESC
LIMIT @size::int OFFSET @skip::int;

-- name: EventPageAfter :many
SELECT id, occurred_at, source, kind, message
FROM event
WHERE (occurred_at, id) < (@at::timestamptz, @id::bigint)
  AND occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
ORDER BY occurred_at DESC, id DESC
LIMIT @size::int;

-- name: EventCount :one
SELECT count(*)::int AS total
FROM (SELECT 1 FROM event
      WHERE occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
      LIMIT @cap::int) AS capped;

-- name: AlertPage :many
SELECT id, occurred_at, severity, name, message
FROM alert
WHERE occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
ORDER BY occurred_at DESC, id DESC
LIMIT @size::int OFFSET @skip::int;

-- name: AlertPageAfter :many
SELECT id, occurred_at, severity, name, message
FROM alert
WHERE (occurred_at, id) < (@at::timestamptz, @id::bigint)
  AND occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
ORDER BY occurred_at DESC, id DESC
LIMIT @size::int;

-- name: AlertCount :one
SELECT count(*)::int AS total
FROM (SELECT 1 FROM alert
      WHERE occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
      LIMIT @cap::int) AS capped;

-- name: AuditEventExport :many
-- The audit export, oldest first, one row more than the row cap so the
-- stream knows whether the cap cut it short.
SELECT id, occurred_at, actor, action, target
FROM audit_event
WHERE occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
ORDER BY occurred_at, id
LIMIT @max_rows::int;

-- name: AuditEventRecord :exec
-- Records an audit event (the export records itself).
INSERT INTO audit_event (occurred_at, actor, action, target, detail)
VALUES (now(), @actor::text, @action::text, @target::text, @detail::jsonb);

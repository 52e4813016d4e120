-- Settings of the current transaction, used by bounded reads.

-- name: SessionSetStatementTimeout :exec
-- Limits every following statement of the transaction to @ms milliseconds
-- (SET LOCAL statement_timeout, written as set_config so the value can be a
-- parameter). A bounded read sets it to what is left of its time bound, so
-- the database itself stops a read that would outlive the bound.
SELECT set_config('statement_timeout', (@ms::bigint)::text, true);

-- name: SessionPing :exec
-- The cheapest round trip: readiness checks, and the floor every benchmark
-- is measured against.
SELECT 1;

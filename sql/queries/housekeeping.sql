-- Housekeeping (ADR-0196 decision 5, ADR-0134): one replica at a time
-- deletes the lapsed rows of every limit table with the *DeleteLapsed
-- queries of each table's file. Each batch is a short transaction of its
-- own that first takes the housekeeping lock with
-- pg_try_advisory_xact_lock: a replica that finds it taken skips the round
-- instead of queueing, and the lock ends with the transaction, so a replica
-- that dies mid-sweep holds nothing, and the sweep works through PgBouncer
-- in transaction pooling mode (a session lock would not). The two-key form
-- with class 1199 stays clear of the application's own single-key locks
-- and of the slot locks (class 1196).

-- name: HousekeepingTryLock :one
-- Takes the housekeeping lock for the rest of this transaction if nobody
-- holds it; never waits.
SELECT pg_try_advisory_xact_lock(1199, @key::int) AS locked;

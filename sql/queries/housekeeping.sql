-- Housekeeping (ADR-0196 decision 5, ADR-0134): one replica at a time
-- deletes the lapsed rows of every limit table with the *DeleteLapsed
-- queries of each table's file. Mutual exclusion is a session advisory lock
-- taken with pg_try_advisory_lock on a connection the sweep holds for its
-- whole run: a replica that finds it taken skips the round instead of
-- queueing, and a replica that dies mid-sweep drops the lock with its
-- session. The two-key form with class 1199 stays clear of the
-- application's own single-key locks and of the permit tables' classes
-- (1196, 1197, 1198).

-- name: HousekeepingTryLock :one
-- Takes the housekeeping lock for this session if nobody holds it; never
-- waits.
SELECT pg_try_advisory_lock(1199, @key::int) AS locked;

-- name: HousekeepingUnlock :one
-- Gives the housekeeping lock back; false if this session did not hold it.
SELECT pg_advisory_unlock(1199, @key::int) AS unlocked;

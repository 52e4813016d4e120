-- pglimit on a Citus coordinator (run by pglimit.Migrate after the
-- migrations, when the extension citus is installed in the database; a
-- no-op on plain PostgreSQL and on a database already distributed).
--
-- The limit tables are distributed by the column every decision names, and
-- colocated, so that a decision's statement touches one shard, on one
-- worker: slot by scope (its primary key is (kind, scope, slot)),
-- login_attempt, api_request_window and ban by key. The small tables stay on
-- the coordinator, as plain tables: the replica registry (a heartbeat on a
-- reference table would be a two-phase commit on every node; on the
-- coordinator it is one local write) and the refusals per minute. The
-- shards of an UNLOGGED table are UNLOGGED. Distributing in one
-- transaction next to other Citus commands needs sequential mode.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    -- Replicas that start together migrate together: one distributes, the
    -- others wait here and then find it done.
    PERFORM pg_advisory_xact_lock(hashtext('pglimit: distribute on citus'));
    SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'pglimit.slot'::regclass) THEN
        PERFORM create_distributed_table('pglimit.slot', 'scope');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'pglimit.login_attempt'::regclass) THEN
        PERFORM create_distributed_table('pglimit.login_attempt', 'key', colocate_with => 'pglimit.slot');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'pglimit.api_request_window'::regclass) THEN
        PERFORM create_distributed_table('pglimit.api_request_window', 'key', colocate_with => 'pglimit.slot');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'pglimit.ban'::regclass) THEN
        PERFORM create_distributed_table('pglimit.ban', 'key', colocate_with => 'pglimit.slot');
    END IF;
    -- The decisions (migration 00006): each call runs on the worker that
    -- holds the shard of its key or scope, and touches that shard alone.
    IF NOT EXISTS (SELECT 1 FROM pg_dist_object WHERE objid = 'pglimit.rate_decide(text,text,text[],interval[],interval[])'::regprocedure AND distribution_argument_index IS NOT NULL) THEN
        PERFORM create_distributed_function('pglimit.rate_decide(text,text,text[],interval[],interval[])', 'p_key',
                                            colocate_with => 'pglimit.api_request_window');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_object WHERE objid = 'pglimit.rate_borrow(text,text,text,interval,interval,int,int)'::regprocedure AND distribution_argument_index IS NOT NULL) THEN
        PERFORM create_distributed_function('pglimit.rate_borrow(text,text,text,interval,interval,int,int)', 'p_key',
                                            colocate_with => 'pglimit.api_request_window');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_object WHERE objid = 'pglimit.slot_claim(text,text,int,uuid,text,text,text,bigint)'::regprocedure AND distribution_argument_index IS NOT NULL) THEN
        PERFORM create_distributed_function('pglimit.slot_claim(text,text,int,uuid,text,text,text,bigint)', 'p_scope',
                                            colocate_with => 'pglimit.slot');
    END IF;
END
$$;

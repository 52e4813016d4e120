-- +goose Up

-- The decisions pglimit makes on Citus (sql/schema/citus/distribute.sql).
-- On Citus a statement that writes a distributed table with INSERT ... ON
-- CONFLICT DO UPDATE may call only immutable functions in its SET and
-- WHERE, and the rate limit's GCRA and a slot claim need the clock there.
-- So on Citus each decision is one of these functions, distributed with
-- the table it writes (create_distributed_function, by its key or scope):
-- the coordinator hands the call to the worker that holds the key's shard,
-- and the function runs there, in one transaction, on that shard alone.
-- Each locks the key's row (or, for a slot, lets the primary key settle a
-- race), reads the clock once after the lock, decides in PL/pgSQL and
-- writes plain values. They make the same decisions as the statements of
-- sql/queries/api_request_window.sql and slot.sql (the ratelimit and permit
-- tests run both over the same histories on one server); on one server
-- pglimit runs the statements, which cost less. The functions are created
-- everywhere so that one schema serves both.

-- pglimit.rate_decide is APIRequestWindowDecide: a request of the key
-- judged against every policy of the request (p_increments = cost x T,
-- p_tolerances = burst x T, one per policy); admitted only if all have
-- room, then all are spent; the TATs of the key's other policies that are
-- still ahead are kept. It returns the decision, the key's policies and
-- TATs after it (a refused request's as they were) and its time.
-- +goose StatementBegin
CREATE FUNCTION pglimit.rate_decide(p_name text, p_key text, p_policies text[], p_increments interval[],
                                    p_tolerances interval[])
RETURNS TABLE (allowed boolean, policies text[], tats timestamptz[], decided_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    cur record;
    at timestamptz;
    ok boolean := true;
    pols text[] := '{}';
    tts timestamptz[] := '{}';
    last timestamptz := '-infinity';
    tat timestamptz;
    j int;
BEGIN
    SELECT w.policies, w.tats, w.expires_at INTO cur
    FROM pglimit.api_request_window AS w WHERE w.name = p_name AND w.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        -- The key's first request: an empty row to lock (every TAT is now).
        INSERT INTO pglimit.api_request_window (name, key, policies, tats, allowed, decided_at, expires_at)
        VALUES (p_name, p_key, '{}', '{}', false, '-infinity', '-infinity')
        ON CONFLICT (name, key) DO NOTHING;
        SELECT w.policies, w.tats, w.expires_at INTO cur
        FROM pglimit.api_request_window AS w WHERE w.name = p_name AND w.key = p_key FOR UPDATE;
    END IF;
    at := clock_timestamp(); -- after the lock: decisions on a key are stamped in order
    FOR i IN 1 .. coalesce(cardinality(p_policies), 0) LOOP
        tat := greatest(cur.tats[array_position(cur.policies, p_policies[i])], at) + p_increments[i];
        ok := ok AND tat <= at + p_tolerances[i];
        pols := pols || p_policies[i];
        tts := tts || tat;
        last := greatest(last, tat);
    END LOOP;
    decided_at := at;
    allowed := ok;
    IF NOT ok THEN
        UPDATE pglimit.api_request_window AS w
        SET allowed = false, decided_at = at,
            expires_at = CASE WHEN cur.expires_at = '-infinity' THEN at ELSE cur.expires_at END
        WHERE w.name = p_name AND w.key = p_key;
        policies := cur.policies;
        tats := cur.tats;
        RETURN NEXT;
        RETURN;
    END IF;
    FOR o IN 1 .. coalesce(cardinality(cur.policies), 0) LOOP
        -- The key's other policies, kept while they are ahead of now.
        IF cur.tats[o] > at AND cur.policies[o] <> ALL (p_policies) THEN
            pols := pols || cur.policies[o];
            tts := tts || cur.tats[o];
        END IF;
    END LOOP;
    UPDATE pglimit.api_request_window AS w
    SET policies = pols, tats = tts, allowed = true, decided_at = at, expires_at = greatest(cur.expires_at, last)
    WHERE w.name = p_name AND w.key = p_key;
    policies := pols;
    tats := tts;
    RETURN NEXT;
END
$fn$;
-- +goose StatementEnd

-- pglimit.rate_borrow is APIRequestWindowBorrow: it spends, all or
-- nothing, p_need units and up to p_want more, at most a share of what the
-- key has free (half while at least half is free, a quarter down to a
-- fifth, a tenth below). No row when the key's row holds other policies.
-- +goose StatementBegin
CREATE FUNCTION pglimit.rate_borrow(p_name text, p_key text, p_policy text, p_unit interval, p_tolerance interval,
                                    p_need int, p_want int)
RETURNS TABLE (allowed boolean, tat timestamptz, decided_at timestamptz, borrowed int)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    cur record;
    at timestamptz;
    base timestamptz;
    free numeric;
    burst numeric;
    units int;
BEGIN
    SELECT w.policies, w.tats, w.expires_at INTO cur
    FROM pglimit.api_request_window AS w WHERE w.name = p_name AND w.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO pglimit.api_request_window (name, key, policies, tats, allowed, decided_at, expires_at)
        VALUES (p_name, p_key, ARRAY[p_policy], ARRAY['-infinity'::timestamptz], false, '-infinity', '-infinity')
        ON CONFLICT (name, key) DO NOTHING;
        SELECT w.policies, w.tats, w.expires_at INTO cur
        FROM pglimit.api_request_window AS w WHERE w.name = p_name AND w.key = p_key FOR UPDATE;
    END IF;
    IF cur.policies <> ARRAY[p_policy] THEN
        RETURN;
    END IF;
    at := clock_timestamp();
    base := greatest(cur.tats[1], at);
    free := floor(extract(epoch FROM at + p_tolerance - base) / extract(epoch FROM p_unit));
    burst := floor(extract(epoch FROM p_tolerance) / extract(epoch FROM p_unit));
    units := CASE WHEN p_need > free THEN 0
                  ELSE greatest(p_need, least(p_need + p_want, floor(free * CASE
                      WHEN free * 2 >= burst THEN 0.5
                      WHEN free * 5 >= burst THEN 0.25
                      ELSE 0.1 END)::int)) END;
    IF units > 0 THEN
        UPDATE pglimit.api_request_window AS w
        SET tats = ARRAY[base + p_unit * units], allowed = true, decided_at = at,
            expires_at = base + p_unit * units, borrowed = units
        WHERE w.name = p_name AND w.key = p_key;
        RETURN QUERY SELECT true, base + p_unit * units, at, units;
        RETURN;
    END IF;
    -- A refusal writes only allowed and decided_at (and a new row's clock).
    UPDATE pglimit.api_request_window AS w
    SET tats = CASE WHEN cur.tats[1] = '-infinity' THEN ARRAY[at] ELSE cur.tats END, allowed = false,
        decided_at = at, expires_at = CASE WHEN cur.expires_at = '-infinity' THEN at ELSE cur.expires_at END,
        borrowed = 0
    WHERE w.name = p_name AND w.key = p_key;
    RETURN QUERY SELECT false, CASE WHEN cur.tats[1] = '-infinity' THEN at ELSE cur.tats[1] END, at, 0;
END
$fn$;
-- +goose StatementEnd

-- pglimit.slot_claim is SlotClaimLone judged to the end: the lowest free
-- slot of one scope, taken while fewer than p_cap are live. A claim that
-- loses the slot it picked to another claim (the primary key settles it:
-- ON CONFLICT waits for the other claim's transaction and finds a live
-- holder) reads the scope again, in a new snapshot, and tries the next free
-- slot, so a claim is refused only when the scope is full. It returns the
-- slot granted (0: refused), the live slots it saw and the milliseconds
-- until the first of them lapses. Times are the transaction's start
-- (now()). A heavy claim's two scopes call it twice in one transaction
-- (on Citus, a distributed one): both or neither.
-- +goose StatementBegin
CREATE FUNCTION pglimit.slot_claim(p_scope text, p_kind text, p_cap int, p_lease_id uuid, p_holder text,
                                   p_endpoint text, p_replica text, p_lease_ms bigint)
RETURNS TABLE (granted_slot int, live int, first_lapse_ms bigint)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    at timestamptz := now();
    first_lapse timestamptz;
    free int;
BEGIN
    LOOP
        SELECT count(*), min(l.expires_at), coalesce(min(l.rn) FILTER (WHERE l.slot <> l.rn), count(*) + 1)
        INTO live, first_lapse, free
        FROM (
            SELECT s.slot, s.expires_at, row_number() OVER (ORDER BY s.slot) AS rn
            FROM pglimit.slot AS s
            WHERE s.kind = p_kind AND s.scope = p_scope AND s.expires_at > at
        ) AS l;
        first_lapse_ms := coalesce(ceil(extract(epoch FROM first_lapse - at) * 1000), 0);
        granted_slot := 0;
        IF live >= p_cap THEN
            RETURN NEXT;
            RETURN;
        END IF;
        INSERT INTO pglimit.slot AS s (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
        VALUES (p_kind, p_scope, free, p_lease_id, p_holder, p_endpoint, p_replica, at,
                at + interval '1 millisecond' * p_lease_ms)
        ON CONFLICT (kind, scope, slot) DO UPDATE
            SET lease_id = excluded.lease_id, holder = excluded.holder,
                endpoint = excluded.endpoint, replica = excluded.replica,
                claimed_at = excluded.claimed_at, expires_at = excluded.expires_at
            WHERE s.expires_at <= excluded.claimed_at
        RETURNING s.slot INTO granted_slot;
        IF granted_slot IS NOT NULL THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pglimit.slot_claim(text, text, int, uuid, text, text, text, bigint);
DROP FUNCTION pglimit.rate_borrow(text, text, text, interval, interval, int, int);
DROP FUNCTION pglimit.rate_decide(text, text, text[], interval[], interval[]);

package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/housekeeping"
	"github.com/pglimit/pglimit/internal/harness/citustest"
	"github.com/pglimit/pglimit/internal/permit"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/ratelimit"
)

// statementLog records every statement a pool runs, with its arguments.
type statementLog struct {
	mu    sync.Mutex
	calls []statementCall
}

type statementCall struct {
	name, sql string
	args      []any
}

func (s *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	name := ""
	if rest, ok := strings.CutPrefix(d.SQL, "-- name: "); ok {
		name, _, _ = strings.Cut(rest, " ")
	}
	s.mu.Lock()
	s.calls = append(s.calls, statementCall{name: name, sql: d.SQL, args: d.Args})
	s.mu.Unlock()
	return ctx
}

func (s *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// byName returns the first call of every named statement.
func (s *statementLog) byName() map[string]statementCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]statementCall{}
	for _, c := range s.calls {
		if _, ok := out[c.name]; !ok && c.name != "" {
			out[c.name] = c
		}
	}
	return out
}

// TestOnCitus: pglimit.Migrate on a Citus coordinator (two workers)
// distributes the limit tables, colocated, by the column each decision
// names, keeps their shards UNLOGGED and leaves the small tables on the
// coordinator; the sign-in throttle works there as on one server (reset
// and the refusal answered from memory included); and every statement its
// decisions make is a router statement — one task, on the shard of its
// key — by Citus' own plan (EXPLAIN on a fresh session): the sign-in
// throttle's statements, and the rate limit's decisions, its borrowing and
// the slot claims and releases, which on Citus call the functions of
// migration 00006 that Citus runs on the shard of their key. The rate
// limit (one policy and several, borrowing included) and the three kinds
// of slots (heavy permits in two scopes, in-flight, uploads) hold their
// limits there, and housekeeping sweeps every table.
func TestOnCitus(t *testing.T) {
	if ok, line := citustest.Installed(); !ok {
		t.Skip(line)
	}
	if testing.Short() {
		t.Skip("a Citus cluster of three servers")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, err := citustest.Start(ctx, citustest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })
	url := cluster.URL("postgres")

	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	log := &statementLog{}
	cfg.ConnConfig.Tracer = log
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Replicas that start together migrate together: one distributes the
	// tables, the others find them distributed.
	migrated := make(chan error, 3)
	for range 3 {
		go func() { migrated <- pglimit.Migrate(ctx, pool) }()
	}
	for range 3 {
		if err := <-migrated; err != nil {
			t.Fatalf("Migrate, three at once: %v", err)
		}
	}
	if err := pglimit.Migrate(ctx, pool); err != nil { // a restart
		t.Fatalf("Migrate again: %v", err)
	}

	// The placement, by Citus' catalog.
	rows, err := pool.Query(ctx, `SELECT logicalrelid::text, column_to_column_name(logicalrelid, partkey), colocationid
		FROM pg_dist_partition WHERE logicalrelid::text LIKE 'pglimit.%' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	placed := map[string]string{}
	colocation := map[int64]bool{}
	for rows.Next() {
		var table, column string
		var group int64
		if err := rows.Scan(&table, &column, &group); err != nil {
			t.Fatal(err)
		}
		placed[table] = column
		colocation[group] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"pglimit.slot": "scope", "pglimit.login_attempt": "key", "pglimit.api_request_window": "key", "pglimit.ban": "key"}
	if fmt.Sprint(placed) != fmt.Sprint(want) || len(colocation) != 1 {
		t.Fatalf("distributed: %v in %d colocation groups; want %v, colocated", placed, len(colocation), want)
	}
	for _, w := range cluster.WorkerURLs("postgres") {
		var logged int
		if err := pgxQueryRow(ctx, w, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'pglimit' AND c.relkind = 'r' AND c.relname ~ '^(slot|login_attempt|api_request_window|ban)_[0-9]+$'
			AND c.relpersistence <> 'u'`, &logged); err != nil {
			t.Fatal(err)
		}
		if logged != 0 {
			t.Fatalf("a worker holds %d logged shards of the limit tables, want none", logged)
		}
	}

	// The sign-in throttle on the coordinator, its bus included.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- pglimit.Run(runCtx, pool, pglimit.RunOptions{Logger: quiet}) }()
	defer func() { stopRun(); <-runDone }()
	throttle, err := signin.New(pool, signin.Options{Limit: 2, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	lenient, err := signin.New(pool, signin.Options{Limit: 2, Lenient: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		p, err := throttle.Acquire(ctx, "username:eve")
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Fail(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := throttle.Acquire(ctx, "username:eve"); !errors.Is(err, pglimit.ErrLimited) {
		t.Fatalf("a third attempt: %v, want it throttled", err)
	}
	if n, err := throttle.Reset(ctx, "eve"); err != nil || n != 2 {
		t.Fatalf("Reset: %d, %v", n, err)
	}
	p, err := lenient.Acquire(ctx, "username:frank")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Fail(ctx); err != nil {
		t.Fatal(err)
	}
	ok, err := throttle.Acquire(ctx, "username:dave")
	if err != nil {
		t.Fatal(err)
	}
	if err := ok.Succeed(ctx); err != nil {
		t.Fatal(err)
	}
	rate, err := ratelimit.New(pool, ratelimit.Options{Logger: quiet,
		Policies: []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rate.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}

	onCitusRates(ctx, t, pool, quiet)
	onCitusSlots(ctx, t, pool, quiet)

	// Every statement the decisions above made, and the resets, planned by
	// Citus on a fresh session.
	router := []string{"LoginAttemptGet", "LoginAttemptReserve", "LoginAttemptRecordFailure", "LoginAttemptClear",
		"APIRequestWindowReset", "APIRequestWindowDecideOneOnShard", "APIRequestWindowDecideOnShard", "APIRequestWindowBorrowOnShard",
		"APIRequestWindowGiveBack", "APIRequestWindowSettle", "SlotClaimOnShard", "SlotReleaseOne"}
	calls := log.byName()
	// Every other named statement the pool ran is one of these, which are
	// not a decision of a key: each is on the coordinator's own tables or
	// over every shard, and said so here. A new statement that is neither
	// listed as a decision above nor here fails the test.
	notDecisions := map[string]string{
		"SchemaCreate":                    "Migrate: the schema, on the coordinator",
		"SchemaOnCitus":                   "Migrate and the limiters: is Citus here (a catalog read)",
		"RefusalMinuteAdd":                "refusals per minute: a coordinator table, at most a write a second per limiter",
		"RefusalMinuteDeleteLapsed":       "housekeeping of that coordinator table",
		"BusNotify":                       "a reset's notice to every replica: pg_notify on the coordinator",
		"BusPing":                         "the bus's liveness check: pg_notify on the coordinator",
		"BusKey":                          "the bus's key, read when it connects: a coordinator table",
		"ReplicaHeartbeat":                "the replica registry: a coordinator table",
		"ReplicaDeleteLapsed":             "housekeeping of the registry",
		"HousekeepingTryLock":             "housekeeping's turn: an advisory lock on the coordinator",
		"SlotDeleteLapsedAll":             "housekeeping: every shard in one statement, once a minute",
		"LoginAttemptDeleteLapsedAll":     "housekeeping: every shard in one statement, once a minute",
		"APIRequestWindowDeleteLapsedAll": "housekeeping: every shard in one statement, once a minute",
		"BanDeleteLapsedAll":              "housekeeping: every shard in one statement, once a minute",
		"QuotaUsageDeleteLapsed":          "housekeeping of a coordinator table (quotas are not distributed)",
		"QuotaLedgerDeleteLapsed":         "housekeeping of a coordinator table (quotas are not distributed)",
		"AccessRuleDeleteLapsed":          "housekeeping of a coordinator table (the allow and deny lists are not distributed)",
		"ShareClaim":                      "a share (rate, in-flight): a coordinator table, a claim at start and after a lapse",
		"ShareRenew":                      "a share: a coordinator table, a renewal every few seconds",
		"ShareRelease":                    "a share given back: a coordinator table",
		"ShareHolders":                    "a slot limiter's list of share holders: a coordinator table, every few seconds",
	}
	for name := range calls {
		if _, ok := notDecisions[name]; !ok && !slices.Contains(router, name) {
			t.Errorf("%s was run but is neither proven a router statement nor listed as not a decision", name)
		}
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, name := range router {
		c, ok := calls[name]
		if !ok {
			t.Errorf("%s was not run", name)
			continue
		}
		var plan []string
		rows, err := conn.Query(ctx, "EXPLAIN "+c.sql, c.args...)
		if err != nil {
			t.Errorf("EXPLAIN %s: %v", name, err)
			continue
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Errorf("EXPLAIN %s: %v", name, err)
			continue
		}
		text := strings.Join(plan, "\n")
		if !oneTask.MatchString(text) || strings.Contains(text, "Distributed Subplan") {
			t.Errorf("%s is not a router statement on Citus:\n%s", name, text)
		}
	}
}

// onCitusRates: the rate limit on Citus — one policy, several policies
// (all or nothing), borrowing — holds its limits exactly.
func onCitusRates(ctx context.Context, t *testing.T, pool *pgxpool.Pool, quiet *slog.Logger) {
	t.Helper()
	one, err := ratelimit.New(pool, ratelimit.Options{Logger: quiet,
		Policies: []ratelimit.Policy{{Name: "api", Limit: 3, Window: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 6 {
		_, err := one.Acquire(ctx, "token:one")
		switch {
		case err == nil:
			admitted++
		case !errors.Is(err, pglimit.ErrLimited):
			t.Fatalf("one policy: %v", err)
		}
	}
	if admitted != 3 {
		t.Fatalf("one policy of 3 an hour: %d of 6 admitted", admitted)
	}

	// Two policies: the hourly one admits 4, the minute one 2 — a request
	// refused by either spends neither.
	policies := []ratelimit.Policy{{Name: "minute", Limit: 2, Window: time.Minute}, {Name: "hour", Limit: 4, Window: time.Hour}}
	two, err := ratelimit.New(pool, ratelimit.Options{Logger: quiet, Policies: policies})
	if err != nil {
		t.Fatal(err)
	}
	admitted = 0
	var refusedBy string
	for range 4 {
		_, err := two.Acquire(ctx, "token:two")
		var le *ratelimit.LimitError
		switch {
		case err == nil:
			admitted++
		case errors.As(err, &le):
			refusedBy = fmt.Sprint(le.Violated)
		default:
			t.Fatalf("two policies: %v", err)
		}
	}
	if admitted != 2 || !strings.Contains(refusedBy, "minute") {
		t.Fatalf("two policies: %d admitted (want 2), refused by %q (want the minute policy)", admitted, refusedBy)
	}

	// Charged after the fact: a further charge and a refund, each one
	// statement on the key's shard.
	settled, err := ratelimit.New(pool, ratelimit.Options{Name: "settled", Logger: quiet,
		Policies: []ratelimit.Policy{{Name: "hour", Limit: 10, Window: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key                     string
		estimate, actual, after int
	}{{"token:more", 2, 5, 5}, {"token:less", 4, 1, 9}} {
		p, err := settled.AcquireN(ctx, tc.key, tc.estimate, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Settle(ctx, tc.actual); err != nil {
			t.Fatalf("settle on Citus: %v", err)
		}
		state, err := settled.AcquireN(ctx, tc.key, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := state.Policies[0].Remaining; got != tc.after {
			t.Errorf("settle of %d at an estimate of %d on Citus: %d remaining, want %d", tc.actual, tc.estimate, got, tc.after)
		}
	}

	// Borrowing: a hot key takes batches on its shard and spends them in
	// memory; never more than the bucket holds.
	const limit = 50
	hot, err := ratelimit.New(pool, ratelimit.Options{Logger: quiet, Borrow: true,
		Policies: []ratelimit.Policy{{Name: "hot", Limit: limit, Window: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	admitted = 0
	for range 4 * limit {
		_, err := hot.Acquire(ctx, "token:hot")
		switch {
		case err == nil:
			admitted++
		case !errors.Is(err, pglimit.ErrLimited):
			t.Fatalf("borrowing: %v", err)
		}
	}
	if err := hot.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if admitted > limit || admitted < limit*9/10 {
		t.Fatalf("borrowing: %d of %d admitted under a limit of %d", admitted, 4*limit, limit)
	}
	// A key far below its limit: every request admitted, and what the
	// replica holds unspent is given back at Flush.
	roomy, err := ratelimit.New(pool, ratelimit.Options{Logger: quiet, Borrow: true,
		Policies: []ratelimit.Policy{{Name: "roomy", Limit: 100_000, Window: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := roomy.Acquire(ctx, "token:roomy"); err != nil {
			t.Fatalf("borrowing below the limit, request %d: %v", i, err)
		}
	}
	if err := roomy.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// onCitusSlots: the three kinds of slots on Citus hold their caps, a claim
// in two scopes is all or nothing, released slots are free again, and
// housekeeping sweeps the lapsed ones.
func onCitusSlots(ctx context.Context, t *testing.T, pool *pgxpool.Pool, quiet *slog.Logger) {
	t.Helper()
	leaser := func(kind permit.Kind) *permit.Leaser {
		l := permit.New(pool, permit.Options{Kind: kind, Logger: quiet, Replica: "citus-test"})
		return l
	}
	claim := func(l *permit.Leaser, lease time.Duration, scopes ...permit.Scope) (*permit.Lease, error) {
		return l.Claim(ctx, permit.Claim{Scopes: scopes, Holder: "alice", Endpoint: "/x", Lease: lease})
	}
	heavy := leaser(permit.HeavyPermit)
	user, installation := permit.Scope{Key: "user:alice", Cap: 2}, permit.Scope{Key: "installation", Cap: 3}
	var held []*permit.Lease
	for range 2 {
		l, err := claim(heavy, time.Minute, user, installation)
		if err != nil {
			t.Fatalf("heavy: %v", err)
		}
		held = append(held, l)
	}
	var refused *permit.RefusedError
	if _, err := claim(heavy, time.Minute, user, installation); !errors.As(err, &refused) || refused.Scope.Key != user.Key {
		t.Fatalf("heavy, the user's third: %v, want refused by %s", err, user.Key)
	}
	bob := permit.Scope{Key: "user:bob", Cap: 2}
	if _, err := claim(heavy, time.Minute, bob, installation); err != nil {
		t.Fatalf("heavy, bob's first: %v", err)
	}
	// The installation is full now: bob's second is refused by it, and
	// takes no slot of bob's (all or nothing, across two shards).
	if _, err := claim(heavy, time.Minute, bob, installation); !errors.As(err, &refused) || refused.Scope.Key != installation.Key {
		t.Fatalf("heavy, bob's second: %v, want refused by the installation", err)
	}
	var bobs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pglimit.slot WHERE kind = 'heavy_permit'
		AND scope LIKE '%bob%' AND expires_at > now()`).Scan(&bobs); err != nil {
		t.Fatal(err)
	}
	if bobs != 1 {
		t.Fatalf("bob holds %d heavy slots after a refused claim, want 1", bobs)
	}
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := claim(heavy, time.Minute, user, installation); err != nil {
		t.Fatalf("heavy, after the releases: %v", err)
	}

	for _, kind := range []permit.Kind{permit.RequestInFlight, permit.UploadWindow} {
		l := leaser(kind)
		scope := permit.Scope{Key: "token:t", Cap: 3}
		var leases []*permit.Lease
		for range 3 {
			lease, err := claim(l, 200*time.Millisecond, scope)
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
			leases = append(leases, lease)
		}
		if _, err := claim(l, time.Minute, scope); !errors.Is(err, permit.ErrRefused) {
			t.Fatalf("%s, the fourth: %v, want refused", kind, err)
		}
		if err := leases[0].Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := claim(l, time.Minute, scope); err != nil {
			t.Fatalf("%s, after a release: %v", kind, err)
		}
	}

	time.Sleep(300 * time.Millisecond) // the 200 ms leases lapse
	lapsed := func() map[string]int64 {
		rows, err := pool.Query(ctx, `SELECT kind, count(*) FROM pglimit.slot WHERE expires_at <= now() GROUP BY kind`)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
			kind string
			n    int64
		}, error) {
			var v struct {
				kind string
				n    int64
			}
			return v, r.Scan(&v.kind, &v.n)
		})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int64{}
		for _, v := range out {
			m[v.kind] = v.n
		}
		return m
	}
	before := lapsed()
	if before["request_in_flight"] < 2 || before["upload_window"] < 2 {
		t.Fatalf("lapsed slots before the sweep: %v, want the lapsed leases among them", before)
	}
	deleted, err := housekeeping.Sweep(ctx, pool)
	if err != nil {
		t.Fatalf("Sweep on Citus: %v", err)
	}
	for kind, n := range before {
		if deleted[kind] != n {
			t.Errorf("Sweep deleted %d rows of %s, the table held %d lapsed (all: %v)", deleted[kind], kind, n, deleted)
		}
	}
	if after := lapsed(); len(after) != 0 {
		t.Errorf("lapsed slots after the sweep: %v, want none", after)
	}
}

// oneTask is the line of a router plan: one task, on one shard.
var oneTask = regexp.MustCompile(`(?m)^\s*Task Count: 1$`)

func pgxQueryRow(ctx context.Context, url, sql string, dst ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql).Scan(dst...)
}

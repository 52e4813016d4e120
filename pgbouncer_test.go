package pglimit_test

// pglimit behind PgBouncer 1.18 in transaction pooling mode, where a server
// connection is a client's for one transaction only and named prepared
// statements do not follow a client from one server connection to the next
// (protocol-level prepared statements came with PgBouncer 1.21's
// max_prepared_statements). docs/operations.md, "Behind PgBouncer", says what these
// tests measure.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgbouncer"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/signin"
)

// bouncerPool is a pool of maxConns client connections through b to the
// database of upstream, in pgx's exec mode mode.
func bouncerPool(t testing.TB, b *pgbouncer.Bouncer, upstream, mode string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgtest.Pool(t, pgbouncer.WithParam(b.URL(upstream), "default_query_exec_mode", mode), maxConns)
}

// modeResult is what one exec mode did to pglimit's statements.
type modeResult struct {
	statements int            // calls made (each one or more statements)
	failed     int            // calls that failed
	wrong      int            // calls that answered, wrongly
	kinds      map[string]int // failures by SQLSTATE, or by message
	migrate    error          // pglimit.Migrate through the pooler
	run        error          // pglimit.Run through the pooler, and what it logged at WARN or above
	registered bool           // the registry's row was there while Run ran
}

func (r *modeResult) add(err error) {
	r.statements++
	if err == nil || errors.Is(err, pglimit.ErrLimited) {
		return
	}
	r.failed++
	r.kinds[kindOf(err)]++
}

func kindOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code + " " + pgErr.Message
	}
	s := err.Error()
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

func (r *modeResult) String() string {
	var kinds []string
	for k, n := range r.kinds {
		kinds = append(kinds, fmt.Sprintf("%d× %s", n, k))
	}
	sort.Strings(kinds)
	return fmt.Sprintf("%d of %d calls failed, %d answered wrongly; Migrate: %v; Run: %v, registered %v; failures: %s",
		r.failed, r.statements, r.wrong, r.migrate, r.run, r.registered, strings.Join(kinds, " | "))
}

// TestPgBouncerExecModes runs pglimit's statements through PgBouncer in
// transaction pooling mode (pool size 2, so clients share server
// connections), from two pools standing in for two replicas, once per pgx
// exec mode: Migrate from both pools at once, pglimit.Run (registry and
// housekeeping), heavy permits (the claim Batch), sign-in checks and
// failures, heavy.Read (a transaction with a transaction-local
// statement_timeout), and a query of the service's own whose answer is
// checked. The modes that prepare a statement in one round trip and use it
// in another fail: cache_statement (pgx's default) with 42P05 "prepared
// statement ... already exists" or 26000 "... does not exist", and
// describe_exec, whose unnamed statement another client replaces between
// its describe and its execute. cache_describe, exec and simple_protocol
// send every statement whole in one round trip and run everything.
func TestPgBouncerExecModes(t *testing.T) {
	t.Parallel()
	server := pgtest.EmptyURL(t) // only to reach the server: each mode has a database of its own
	b := pgbouncer.ForTest(t, server, pgbouncer.Options{PoolSize: 2})
	fails := map[string]bool{"cache_statement": true, "describe_exec": true}
	var mu sync.Mutex
	results := map[string]*modeResult{}
	t.Run("modes", func(t *testing.T) {
		for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
			t.Run(mode, func(t *testing.T) {
				t.Parallel()
				upstream := pgtest.EmptyURL(t)
				res := runModeWorkload(t, b, upstream, mode)
				mu.Lock()
				results[mode] = res
				mu.Unlock()
				t.Logf("%s behind PgBouncer (transaction pooling): %v", mode, res)
				works := res.failed == 0 && res.wrong == 0 && res.migrate == nil && res.run == nil && res.registered
				if fails[mode] && works {
					t.Errorf("%s ran everything behind PgBouncer in transaction mode; it was expected to fail", mode)
				}
				if !fails[mode] && !works {
					t.Errorf("%s failed behind PgBouncer in transaction mode: %v", mode, res)
				}
			})
		}
	})
	for _, mode := range slices.Sorted(func(yield func(string) bool) {
		for m := range results {
			if !yield(m) {
				return
			}
		}
	}) {
		t.Logf("%-16s %v", mode, results[mode])
	}
}

// runModeWorkload runs pglimit's statements in mode through b on upstream's
// database.
func runModeWorkload(t *testing.T, b *pgbouncer.Bouncer, upstream, mode string) *modeResult {
	res := &modeResult{kinds: map[string]int{}}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pools := []*pgxpool.Pool{bouncerPool(t, b, upstream, mode, 6), bouncerPool(t, b, upstream, mode, 6)}

	// Both replicas migrate at once, through the pooler.
	errs := make([]error, len(pools))
	var wg sync.WaitGroup
	for i, p := range pools {
		wg.Go(func() { errs[i] = pglimit.Migrate(ctx, p) })
	}
	wg.Wait()
	res.migrate = errors.Join(errs...)
	if res.migrate != nil {
		// A migration the pooler breaks fails with the database's error,
		// not by retrying the migration lock until the context ends (it
		// did, beside two CPU hogs, before the lock's retries were limited
		// to a lock held by another migrator or a database that cannot
		// answer now).
		if errors.Is(res.migrate, context.DeadlineExceeded) {
			t.Errorf("Migrate through the pooler in %s ran out of time instead of failing: %v", mode, res.migrate)
		}
		// Go on, migrated directly, to see what the other statements do. A
		// lock row a failed migrator left behind lapses with its lease
		// (30 s), so this migration has a minute of its own.
		direct := pgtest.Pool(t, upstream, 2)
		directCtx, cancelDirect := context.WithTimeout(t.Context(), time.Minute)
		defer cancelDirect()
		if err := pglimit.Migrate(directCtx, direct); err != nil {
			t.Fatalf("migrate directly: %v", err)
		}
	}

	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	logged := &warnings{}
	go func() {
		runDone <- pglimit.Run(runCtx, pools[0], pglimit.RunOptions{Replica: "r-" + mode,
			Heartbeat: 200 * time.Millisecond, Housekeeping: 50 * time.Millisecond, Logger: slog.New(logged)})
	}()

	var resMu sync.Mutex
	record := func(err error) {
		resMu.Lock()
		defer resMu.Unlock()
		res.add(err)
	}
	for i, pool := range pools {
		reports, err := heavy.New(pool, heavy.Options{Name: "report", Key: noKey, Limit: 2, InstallationLimit: 100, Time: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		throttle, err := signin.New(pool, signin.Options{Lenient: true, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		for g := range 4 {
			wg.Go(func() {
				for n := range 25 {
					key := fmt.Sprintf("user-%d", (i*4+g+n)%5)
					// A heavy permit: the claim Batch, then its release.
					p, err := reports.Acquire(ctx, key)
					record(err)
					if err == nil {
						// A bounded read in the permit's time bound.
						work, done := heavy.NewContext(ctx, reports.Bounds())
						var live int
						err = heavy.Read(work, pool, func(tx pgx.Tx) error {
							return tx.QueryRow(work, `SELECT count(*) FROM pglimit.heavy_permit WHERE expires_at > now()`).Scan(&live)
						})
						done()
						record(err)
						record(p.Release(ctx))
					}
					// A sign-in: the check, then a failure or a success.
					sp, err := throttle.Acquire(ctx, "username:"+key)
					record(err)
					if err == nil {
						if n%3 == 0 {
							record(sp.Succeed(ctx))
						} else {
							record(sp.Fail(ctx))
						}
					}
					// A statement of the service's own, its answer checked.
					want := i*1000 + g*100 + n
					var got int
					err = pool.QueryRow(ctx, `SELECT $1::int + 1`, want).Scan(&got)
					record(err)
					if err == nil && got != want+1 {
						resMu.Lock()
						res.wrong++
						resMu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	var rows int
	if err := pools[1].QueryRow(ctx, `SELECT count(*) FROM pglimit.replica WHERE name = $1`, "r-"+mode).Scan(&rows); err == nil {
		res.registered = rows == 1
	}
	stopRun()
	res.run = errors.Join(<-runDone, logged.err())
	return res
}

// warnings is a slog.Handler that keeps the records at WARN and above.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	w.mu.Lock()
	w.msgs = append(w.msgs, msg)
	w.mu.Unlock()
	return nil
}

func (w *warnings) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.msgs) == 0 {
		return nil
	}
	return fmt.Errorf("logged %d warnings, the first: %s", len(w.msgs), w.msgs[0])
}

func noKey(*http.Request) (string, bool) { return "", false }

// TestPgBouncerClaimIsOneTransaction shows that a permit claim stays one
// implicit transaction behind PgBouncer in transaction pooling mode: the
// scope lock and the claim travel in one pgx Batch ending in one Sync, so
// PgBouncer hands the server connection back only after both. Four pools
// (replicas) of four claimers each claim one key's 16 permits at once, round
// after round: every claim is granted — which needs the lock taken in the
// claim's own transaction (sent apart, two claimers pick the same free slot
// and the loser is refused with room left: this test then fails at its
// first rounds) — and a 17th claim, made while they are held, is refused.
func TestPgBouncerClaimIsOneTransaction(t *testing.T) {
	t.Parallel()
	upstream := pgtest.URL(t)
	b := pgbouncer.ForTest(t, upstream, pgbouncer.Options{PoolSize: 4})
	const capacity, rounds = 16, 30
	var limiters []*heavy.Limiter
	for range 4 {
		l, err := heavy.New(bouncerPool(t, b, upstream, "exec", 4), heavy.Options{
			Name: "burst", Key: noKey, Limit: capacity, InstallationLimit: 100, Time: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		limiters = append(limiters, l, l, l, l)
	}
	ctx := t.Context()
	for round := range rounds {
		start := make(chan struct{})
		permits := make([]*limit.Permit, len(limiters))
		errs := make([]error, len(limiters))
		var wg sync.WaitGroup
		for i, l := range limiters {
			wg.Go(func() {
				<-start
				permits[i], errs[i] = l.Acquire(ctx, "alice")
			})
		}
		close(start)
		wg.Wait()
		refused := 0
		for i, err := range errs {
			switch {
			case errors.Is(err, pglimit.ErrLimited):
				refused++
			case err != nil:
				t.Fatalf("round %d: claim %d: %v", round, i, err)
			}
		}
		if refused > 0 {
			t.Fatalf("round %d: %d of %d claims on a cap of %d refused through PgBouncer, with room left", round, refused, len(limiters), capacity)
		}
		if p, err := limiters[round%len(limiters)].Acquire(ctx, "alice"); !errors.Is(err, pglimit.ErrLimited) {
			if p != nil {
				_ = p.Release(ctx)
			}
			t.Fatalf("round %d: a claim beyond the cap of %d: %v, want refused", round, capacity, err)
		}
		for _, p := range permits {
			if err := p.Release(ctx); err != nil {
				t.Fatalf("round %d: release: %v", round, err)
			}
		}
		// The next round's claimers are the other replicas too: every
		// release must have landed (Flush: any whose wait was cut short).
		for i := 0; i < len(limiters); i += 4 {
			if err := limiters[i].Flush(ctx); err != nil {
				t.Fatalf("round %d: flush: %v", round, err)
			}
		}
	}
}

// TestPgBouncerLeavesNoSessionSettings shows that pglimit changes no
// setting of a session behind PgBouncer: with one server connection for
// every client, what a claim (jit, plan_cache_mode) and heavy.Read
// (statement_timeout) set lasts for their own transaction only, and the
// next client of that connection sees the server's values. The same
// observer sees a session-level SET made by one client: it would see a
// leak.
func TestPgBouncerLeavesNoSessionSettings(t *testing.T) {
	t.Parallel()
	upstream := pgtest.URL(t)
	b := pgbouncer.ForTest(t, upstream, pgbouncer.Options{PoolSize: 1})
	pool := bouncerPool(t, b, upstream, "exec", 2)
	observer := bouncerPool(t, b, upstream, "exec", 1)
	ctx := t.Context()
	settings := func() (pid int, s string) {
		t.Helper()
		if err := observer.QueryRow(ctx, `SELECT pg_backend_pid(),
			concat_ws(' ', current_setting('statement_timeout'), current_setting('plan_cache_mode'), current_setting('jit'))`).Scan(&pid, &s); err != nil {
			t.Fatal(err)
		}
		return pid, s
	}
	pid0, before := settings()

	reports, err := heavy.New(pool, heavy.Options{Name: "report", Key: noKey, Time: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p, err := reports.Acquire(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	work, done := heavy.NewContext(ctx, reports.Bounds())
	var inside, pidInside string
	err = heavy.Read(work, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(work, `SELECT current_setting('statement_timeout'), pg_backend_pid()::text`).Scan(&inside, &pidInside)
	})
	done()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if inside == "0" || pidInside != fmt.Sprint(pid0) {
		t.Fatalf("inside heavy.Read: statement_timeout %s on server pid %s; want a bound on pid %d", inside, pidInside, pid0)
	}
	pid1, after := settings()
	if pid1 != pid0 || after != before {
		t.Fatalf("after a claim and a bounded read, the next client of server pid %d sees %q; before it saw %q (pid %d)", pid1, after, before, pid0)
	}

	// The observer does see a session setting one client leaves behind.
	if _, err := pool.Exec(ctx, `SET statement_timeout = 1234`); err != nil {
		t.Fatal(err)
	}
	if _, leaked := settings(); !strings.HasPrefix(leaked, "1234ms") {
		t.Fatalf("a session SET by one client: the observer sees %q, want 1234ms first", leaked)
	}
	if _, err := pool.Exec(ctx, `RESET statement_timeout`); err != nil {
		t.Fatal(err)
	}
}

// TestPgBouncerStreamStopsItsStatement shows that heavy.Stream stops a
// statement at the row cap behind PgBouncer in transaction pooling mode: its
// cancel request reaches PgBouncer, which passes it to the server connection
// the client holds in its transaction. The statement would take over 15
// minutes to end on its own and its time bound (the statement_timeout
// heavy.Read sets) is 30 s: the read ends with the ROWS mark and more than
// half of the bound left — without the cancel it ends at the bound, 30 s
// later — and the pool serves the next statement.
func TestPgBouncerStreamStopsItsStatement(t *testing.T) {
	t.Parallel()
	upstream := pgtest.URL(t)
	b := pgbouncer.ForTest(t, upstream, pgbouncer.Options{PoolSize: 2})
	pool := bouncerPool(t, b, upstream, "exec", 2)
	ctx := t.Context()
	export, err := heavy.New(pool, heavy.Options{Name: "export", Key: noKey, Time: 30 * time.Second, Rows: 10})
	if err != nil {
		t.Fatal(err)
	}
	p, err := export.Acquire(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(ctx)
	work, done := heavy.NewContext(ctx, export.Bounds())
	defer done()
	var mark heavy.Mark
	err = heavy.Read(work, pool, func(tx pgx.Tx) error {
		// 100,000 rows of 10 ms each.
		rows, err := tx.Query(work, `SELECT g, pg_sleep(0.01) FROM generate_series(1, 100000) AS g`)
		if err != nil {
			return err
		}
		mark, err = heavy.Stream(work, rows, func(pgx.Rows) error { return nil })
		return err
	})
	if err != nil || mark.Bound != heavy.BoundRows || mark.Rows != 10 {
		t.Fatalf("Stream through PgBouncer: %v, %v; want 10 rows and the ROWS mark", mark, err)
	}
	if deadline, _ := work.Deadline(); time.Until(deadline) < export.Bounds().Time/2 {
		t.Fatalf("the read ended %v before its time bound of %v: the cancel request did not stop the statement at the row cap",
			time.Until(deadline).Round(time.Second), export.Bounds().Time)
	}
	var one int
	if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("the next statement on the pool: %d, %v", one, err)
	}
}

// BenchmarkExecModes measures what an exec mode costs pglimit's statements,
// on a direct connection and through PgBouncer (transaction pooling), one
// client: a heavy permit (the claim Batch, then the release) and a sign-in
// check (one read). Compare the modes' ns/op within one run: the
// cache_statement direct figure is the baseline (pgx's default, where the
// claim's generic plan is planned once per connection); exec and the other
// unprepared modes plan every statement each time.
func BenchmarkExecModes(b *testing.B) {
	upstream := pgtest.URL(b)
	bouncer := pgbouncer.ForTest(b, upstream, pgbouncer.Options{PoolSize: 2})
	for _, path := range []string{"direct", "pgbouncer"} {
		for _, mode := range []string{"cache_statement", "cache_describe", "exec", "simple_protocol"} {
			if path == "pgbouncer" && mode == "cache_statement" {
				continue // fails there (TestPgBouncerExecModes)
			}
			var pool *pgxpool.Pool
			if path == "direct" {
				pool = pgtest.Pool(b, pgbouncer.WithParam(upstream, "default_query_exec_mode", mode), 1)
			} else {
				pool = bouncerPool(b, bouncer, upstream, mode, 1)
			}
			reports, err := heavy.New(pool, heavy.Options{Name: "report", Key: noKey, InstallationLimit: 100})
			if err != nil {
				b.Fatal(err)
			}
			throttle, err := signin.New(pool, signin.Options{Lenient: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Run(path+"/"+mode+"/heavy-claim-release", func(b *testing.B) {
				for b.Loop() {
					p, err := reports.Acquire(b.Context(), "alice")
					if err != nil {
						b.Fatal(err)
					}
					if err := p.Release(b.Context()); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(path+"/"+mode+"/sign-in-check", func(b *testing.B) {
				for b.Loop() {
					p, err := throttle.Acquire(b.Context(), "username:alice")
					if err != nil {
						b.Fatal(err)
					}
					_ = p.Release(b.Context())
				}
			})
		}
	}
}

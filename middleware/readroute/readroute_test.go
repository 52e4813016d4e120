package readroute_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/embedpg"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
	"github.com/pglimit/pglimit/middleware/readroute"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

// answer is what the test handler writes: which server answered (the
// independent observer: pg_is_in_recovery() is true only on the replica)
// and what the router said.
type answer struct {
	InRecovery bool `json:"inRecovery"`
	MayLag     bool `json:"mayLag"`
}

// historyHandler reads through readroute.Read, as a history handler does.
func historyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a answer
		var err error
		a.MayLag, err = readroute.Read(r.Context(), func(pool *pgxpool.Pool, mayLag bool) error {
			return pool.QueryRow(r.Context(), `SELECT pg_is_in_recovery()`).Scan(&a.InRecovery)
		})
		if err != nil {
			http.Error(w, "read failed", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(a)
	})
}

// get serves one request through h and returns its status and answer.
func get(t *testing.T, h http.Handler) (int, answer) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/events", nil))
	var a answer
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
			t.Fatalf("body %q: %v", rec.Body, err)
		}
	}
	return rec.Code, a
}

func mustRouter(t *testing.T, primary, replica *pgxpool.Pool, opts readroute.Options) *readroute.Router {
	t.Helper()
	r, err := readroute.New(primary, replica, opts)
	if err != nil {
		t.Fatal(err)
	}
	// One check now, so the test starts from the replica's real health.
	// The checker does not run: a test that needs it calls run.
	r.Check(context.Background())
	return r
}

// run runs r's checker in the background until the test ends.
func run(t *testing.T, r *readroute.Router) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func TestNoReplicaReadsThePrimary(t *testing.T) {
	t.Parallel()
	primary, _ := pgtest.NewDB(t, 4)
	r := mustRouter(t, primary, nil, readroute.Options{})
	if r.Healthy() || r.HasReplica() {
		t.Errorf("Healthy %v, HasReplica %v without a replica", r.Healthy(), r.HasReplica())
	}
	var got *pgxpool.Pool
	var lag bool
	h := r.Handler(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = readroute.Read(req.Context(), func(pool *pgxpool.Pool, mayLag bool) error {
			got, lag = pool, mayLag
			return nil
		})
		historyHandler().ServeHTTP(w, req)
	}))
	code, a := get(t, h)
	if code != http.StatusOK || a.MayLag || a.InRecovery || got != primary || lag {
		t.Errorf("no replica: %d %+v, pool is primary: %v, mayLag %v", code, a, got == primary, lag)
	}
	mayLag, err := r.Read(context.Background(), func(pool *pgxpool.Pool, mayLag bool) error {
		if pool != primary || mayLag {
			return errors.New("not the primary")
		}
		return nil
	})
	if err != nil || mayLag {
		t.Errorf("Router.Read: %v, mayLag %v", err, mayLag)
	}
	if r.Check(context.Background()) {
		t.Error("Check reported a replica that is not configured")
	}
}

// A read through the middleware is served by the replica and says so; a
// replica that stops (cleanly or by a crash) is detected and reads go to
// the primary without an error; when it returns, reads go back to it.
func TestReplicaGoesAndReturns(t *testing.T) {
	t.Parallel()
	for _, stop := range []string{"shutdown", "kill"} {
		t.Run(stop, func(t *testing.T) {
			t.Parallel()
			primaryC, replicaC := pgtest.WithReplica(t)
			primary := pgtest.Pool(t, primaryC.URL("app"), 4)
			replica := pgtest.Pool(t, replicaC.URL("app"), 4)
			r := mustRouter(t, primary, replica, readroute.Options{Interval: 50 * time.Millisecond})
			run(t, r)
			h := r.Handler(historyHandler())

			wait.For(t, 15*time.Second, "a replica that answers is healthy", r.Healthy)
			if code, a := get(t, h); code != http.StatusOK || !a.InRecovery || !a.MayLag {
				t.Fatalf("replica up: %d %+v, want the replica with mayLag", code, a)
			}
			mayLag, err := r.Read(context.Background(), func(pool *pgxpool.Pool, mayLag bool) error {
				if pool != replica || !mayLag {
					return errors.New("not the replica")
				}
				return nil
			})
			if err != nil || !mayLag {
				t.Fatalf("Router.Read with the replica up: %v, mayLag %v", err, mayLag)
			}

			stopCluster(t, replicaC, stop)
			// At once, whether or not the checker has noticed yet: Read
			// falls back. No request fails.
			for range 5 {
				if code, a := get(t, h); code != http.StatusOK || a.InRecovery || a.MayLag {
					t.Fatalf("replica down: %d %+v, want the primary without mayLag", code, a)
				}
			}
			wait.For(t, 15*time.Second, "the checker sees the replica down", func() bool { return !r.Healthy() })
			if code, a := get(t, h); code != http.StatusOK || a.InRecovery || a.MayLag {
				t.Fatalf("replica known down: %d %+v", code, a)
			}
			mayLag, err = r.Read(context.Background(), func(pool *pgxpool.Pool, mayLag bool) error {
				return pool.QueryRow(context.Background(), `SELECT 1`).Scan(new(int))
			})
			if err != nil || mayLag {
				t.Fatalf("Router.Read with the replica down: %v, mayLag %v", err, mayLag)
			}

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := replicaC.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			wait.For(t, 15*time.Second, "reads return to the replica", func() bool {
				code, a := get(t, h)
				return code == http.StatusOK && a.InRecovery && a.MayLag
			})
			if !r.Healthy() {
				t.Error("replica serves but Healthy is false")
			}
		})
	}
}

func stopCluster(t *testing.T, c *embedpg.Cluster, how string) {
	t.Helper()
	var err error
	if how == "kill" {
		err = c.Kill()
	} else {
		err = c.Shutdown()
	}
	if err != nil {
		t.Fatalf("%s: %v", how, err)
	}
}

// A replica that goes down between two health checks: the read that finds
// it down is retried on the primary and succeeds, and the replica is marked
// down at once. The checker here does not run, so only Read's fallback
// can save the request.
func TestReadRacesTheHealthCheck(t *testing.T) {
	t.Parallel()
	primaryC, replicaC := pgtest.WithReplica(t)
	primary := pgtest.Pool(t, primaryC.URL("app"), 4)
	replica := pgtest.Pool(t, replicaC.URL("app"), 4)
	r := mustRouter(t, primary, replica, readroute.Options{Interval: time.Hour})
	h := r.Handler(historyHandler())
	wait.For(t, 15*time.Second, "a replica that answers is healthy", func() bool { return r.Check(context.Background()) })
	if code, a := get(t, h); code != http.StatusOK || !a.InRecovery || !a.MayLag {
		t.Fatalf("replica up: %d %+v", code, a)
	}
	if err := replicaC.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if !r.Healthy() {
		t.Fatal("the replica was marked down before any read found it down")
	}
	var calls []bool
	code, a := get(t, r.Handler(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = readroute.Read(req.Context(), func(pool *pgxpool.Pool, mayLag bool) error {
			calls = append(calls, mayLag)
			return pool.Ping(req.Context())
		})
		historyHandler().ServeHTTP(w, req)
	})))
	if code != http.StatusOK || a.InRecovery || a.MayLag {
		t.Fatalf("read racing the check: %d %+v, want the primary without mayLag", code, a)
	}
	if len(calls) != 2 || !calls[0] || calls[1] {
		t.Errorf("fn ran with mayLag %v, want [true false] (replica, then primary)", calls)
	}
	if r.Healthy() {
		t.Error("a replica that failed a read is still healthy")
	}
	// Router.Read outside HTTP, on a router whose probe claims the replica
	// is up: the read finds it down, falls back and marks it down.
	stale := mustRouter(t, primary, replica, readroute.Options{Interval: time.Hour,
		Probe: func(context.Context, *pgxpool.Pool) error { return nil }})
	mayLag, err := stale.Read(context.Background(), func(pool *pgxpool.Pool, mayLag bool) error {
		return pool.QueryRow(context.Background(), `SELECT 1`).Scan(new(int))
	})
	if err != nil || mayLag || stale.Healthy() {
		t.Errorf("Router.Read racing the check: %v, mayLag %v, healthy %v", err, mayLag, stale.Healthy())
	}
}

// Errors that do not say the replica is unreachable are not retried, and
// do not mark it down; a read that fails on the primary is not retried.
func TestOnlyConnectionErrorsFallBack(t *testing.T) {
	t.Parallel()
	primary, _ := pgtest.NewDB(t, 2)
	replica, _ := pgtest.NewDB(t, 2) // another database stands in for a replica
	m := observetest.New()
	r := mustRouter(t, primary, replica, readroute.Options{Interval: time.Hour, MeterProvider: m})
	wait.For(t, 15*time.Second, "the replica stand-in is healthy", func() bool { return r.Check(context.Background()) })
	calls := 0
	mayLag, err := r.Read(context.Background(), func(pool *pgxpool.Pool, mayLag bool) error {
		calls++
		return pool.QueryRow(context.Background(), `SELECT 1/0`).Scan(new(int))
	})
	if err == nil || calls != 1 || mayLag || !r.Healthy() {
		t.Errorf("SQL error: err %v, %d calls, mayLag %v, healthy %v; want the error, 1 call, no fallback", err, calls, mayLag, r.Healthy())
	}
	// A request whose client went away is not retried, even when the
	// replica's error is of the connection class.
	unreachable := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls = 0
	_, err = r.Read(ctx, func(pool *pgxpool.Pool, mayLag bool) error {
		calls++
		return unreachable
	})
	if err == nil || calls != 1 || !r.Healthy() {
		t.Errorf("canceled: err %v, %d calls, healthy %v", err, calls, r.Healthy())
	}
	// The same error in a live request: the replica is marked down and the
	// read runs again on the primary.
	var pools []*pgxpool.Pool
	mayLag, err = r.Read(context.Background(), func(pool *pgxpool.Pool, mayLag bool) error {
		pools = append(pools, pool)
		if mayLag {
			return unreachable
		}
		return nil
	})
	if err != nil || mayLag || len(pools) != 2 || pools[0] != replica || pools[1] != primary || r.Healthy() {
		t.Errorf("connection error: err %v, mayLag %v, %d calls, healthy %v", err, mayLag, len(pools), r.Healthy())
	}
	// The replica is down now: the next read is the primary's.
	if _, err := r.Read(context.Background(), func(*pgxpool.Pool, bool) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// Every read counted once, by the pool that served it.
	want := map[string]int64{readroute.TargetReplica: 2, readroute.TargetFallback: 1, readroute.TargetPrimary: 1}
	if diff := cmp.Diff(want, m.Counts(t, readroute.MetricReads, "target")); diff != "" {
		t.Errorf("%s (-want +got):\n%s", readroute.MetricReads, diff)
	}
}

// Many concurrent requests while the replica is shut down and restarted:
// every one succeeds, and both servers serve some.
func TestConcurrentReadsWhileReplicaComesAndGoes(t *testing.T) {
	t.Parallel()
	primaryC, replicaC := pgtest.WithReplica(t)
	primary := pgtest.Pool(t, primaryC.URL("app"), 8)
	replica := pgtest.Pool(t, replicaC.URL("app"), 8)
	r := mustRouter(t, primary, replica, readroute.Options{Interval: 50 * time.Millisecond})
	run(t, r)
	h := r.Handler(historyHandler())

	var failed, fromReplica, fromPrimary, wrongLag atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/events", nil))
				var a answer
				if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &a) != nil {
					failed.Add(1)
					continue
				}
				if a.InRecovery != a.MayLag {
					wrongLag.Add(1)
				}
				if a.InRecovery {
					fromReplica.Add(1)
				} else {
					fromPrimary.Add(1)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	if err := replicaC.Shutdown(); err != nil {
		t.Error(err)
	}
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := replicaC.Restart(ctx); err != nil {
		t.Error(err)
	}
	wait.For(t, 15*time.Second, "replica healthy again", r.Healthy)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("replica served %d, primary %d, failed %d", fromReplica.Load(), fromPrimary.Load(), failed.Load())
	if failed.Load() != 0 || wrongLag.Load() != 0 {
		t.Errorf("%d requests failed, %d had mayLag wrong", failed.Load(), wrongLag.Load())
	}
	if fromReplica.Load() == 0 || fromPrimary.Load() == 0 {
		t.Errorf("replica served %d, primary %d; want both", fromReplica.Load(), fromPrimary.Load())
	}
}

// Run checks at once and then every Interval with the injected probe,
// follows its answers both ways, and stops when its context ends, leaving
// reads on the primary; a second Run is refused.
func TestCheckerLifecycle(t *testing.T) {
	t.Parallel()
	primary, _ := pgtest.NewDB(t, 2)
	var up atomic.Bool
	var probes atomic.Int64
	r, err := readroute.New(primary, primary, readroute.Options{
		Interval: 10 * time.Millisecond,
		Probe: func(ctx context.Context, _ *pgxpool.Pool) error {
			probes.Add(1)
			if _, ok := ctx.Deadline(); !ok {
				return errors.New("probe without a timeout")
			}
			if !up.Load() {
				return errors.New("down")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	if r.Healthy() || probes.Load() != 0 {
		t.Fatalf("before Run: healthy %v, %d probes; want no check yet", r.Healthy(), probes.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	wait.For(t, 15*time.Second, "a first check", func() bool { return probes.Load() >= 1 })
	if r.Healthy() {
		t.Fatal("healthy with the replica down")
	}
	up.Store(true)
	wait.For(t, 15*time.Second, "healthy after the probe answers", r.Healthy)
	up.Store(false)
	wait.For(t, 15*time.Second, "down after the probe fails", func() bool { return !r.Healthy() })
	up.Store(true)
	wait.For(t, 15*time.Second, "healthy again", r.Healthy)
	if err := r.Run(ctx); !errors.Is(err, readroute.ErrRunTwice) {
		t.Errorf("second Run: %v, want ErrRunTwice", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v when its context ended, want nil", err)
	}
	if r.Healthy() {
		t.Error("healthy after Run ended")
	}
	n := probes.Load()
	time.Sleep(100 * time.Millisecond)
	if probes.Load() != n {
		t.Errorf("probes went on after Run ended: %d then %d", n, probes.Load())
	}
	if err := r.Run(context.Background()); !errors.Is(err, readroute.ErrRunTwice) {
		t.Errorf("Run after the first ended: %v, want ErrRunTwice", err)
	}
}

// TestRunWithoutReplica waits for its context and returns nil; reads stay
// on the primary.
func TestRunWithoutReplica(t *testing.T) {
	t.Parallel()
	primary, _ := pgtest.NewDB(t, 1)
	r, err := readroute.New(primary, nil, readroute.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.Run(ctx); err != nil || r.Healthy() {
		t.Errorf("Run without a replica = %v, healthy %v", err, r.Healthy())
	}
}

func TestOutsideARoute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	called := false
	lag, err := readroute.Read(ctx, func(*pgxpool.Pool, bool) error { called = true; return nil })
	if !errors.Is(err, readroute.ErrNoRoute) || called || lag {
		t.Errorf("Read outside a route: %v, called %v, mayLag %v", err, called, lag)
	}
	if _, err := readroute.New(nil, nil, readroute.Options{}); err == nil {
		t.Error("New accepted a nil primary")
	}
	primary, _ := pgtest.NewDB(t, 1)
	for _, o := range []readroute.Options{{Interval: -1}, {Timeout: -1}} {
		if _, err := readroute.New(primary, nil, o); err == nil {
			t.Errorf("New accepted %+v", o)
		}
	}
	// The handler leaves the incoming request alone.
	r := mustRouter(t, primary, nil, readroute.Options{})
	req := httptest.NewRequest(http.MethodGet, "/api/audit", nil)
	before := req.Context()
	r.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(httptest.NewRecorder(), req)
	if req.Context() != before {
		t.Error("Handler changed the incoming request's context")
	}
	// mayLag turns true only once a read on the replica has succeeded, and
	// stays true for the request's later reads.
	replicaCtx := mustRouter(t, primary, primary, readroute.Options{Interval: time.Hour}).NewContext(ctx)
	failed := errors.New("a read that failed")
	if lag, err := readroute.Read(replicaCtx, func(*pgxpool.Pool, bool) error { return failed }); !errors.Is(err, failed) || lag {
		t.Errorf("a failed read on the replica: %v, mayLag %v", err, lag)
	}
	if lag, err := readroute.Read(replicaCtx, func(_ *pgxpool.Pool, lag bool) error {
		if !lag {
			return errors.New("not the replica")
		}
		return nil
	}); err != nil || !lag {
		t.Errorf("a read the replica served: %v, mayLag %v", err, lag)
	}
	if lag, err := readroute.Read(replicaCtx, func(*pgxpool.Pool, bool) error { return failed }); !errors.Is(err, failed) || !lag {
		t.Errorf("a failed read after one the replica served: %v, mayLag %v (want true: the request read the replica)", err, lag)
	}
}

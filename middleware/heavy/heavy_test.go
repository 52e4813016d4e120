package heavy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func userHeader(r *http.Request) (string, bool) {
	u := r.Header.Get("X-User")
	return u, u != ""
}

// replica is one stand-in replica: its own pool, limiter and HTTP server.
type replica struct {
	pool    *pgxpool.Pool
	limiter *heavy.Limiter
	srv     *httptest.Server
}

func newReplicas(t *testing.T, url string, n int, instCap int, ep heavy.Endpoint, h http.Handler) []*replica {
	t.Helper()
	out := make([]*replica, n)
	for i := range out {
		pool := pgtest.Pool(t, url, 8)
		l, err := heavy.New(pool, heavy.Options{User: userHeader, InstallationCap: instCap, Replica: fmt.Sprintf("r%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		var handler http.Handler
		if h != nil {
			handler = l.Handler(ep, h)
		} else {
			handler = l.Handler(ep, guarded(pool))
		}
		srv := httptest.NewServer(handler)
		t.Cleanup(srv.Close)
		out[i] = &replica{pool: pool, limiter: l, srv: srv}
	}
	return out
}

// guardedMarker is in the text of every guarded query, so an observer can
// count them in pg_stat_activity.
const guardedMarker = "pglimit-guarded-query"

// guarded runs a bounded read that sleeps 150 ms: the work a permit guards.
func guarded(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := heavy.Read(r.Context(), pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), "SELECT pg_sleep(0.15) -- "+guardedMarker)
			return err
		})
		if err != nil {
			heavy.WriteError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}

// observer polls pg_stat_activity from a connection of its own and keeps
// the highest number of guarded queries it saw running at once.
type observer struct {
	max  atomic.Int64
	seen atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func observe(t *testing.T, url string) *observer {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	o := &observer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(o.done)
		defer conn.Close(context.Background())
		for {
			select {
			case <-o.stop:
				return
			default:
			}
			var n int64
			err := conn.QueryRow(context.Background(), `
				SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'active'
				  AND pid <> pg_backend_pid() AND query LIKE '%' || $1 || '%'`, guardedMarker).Scan(&n)
			if err != nil {
				continue
			}
			o.seen.Add(1)
			for {
				cur := o.max.Load()
				if n <= cur || o.max.CompareAndSwap(cur, n) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return o
}

func (o *observer) finish() (maxRunning int64) {
	close(o.stop)
	<-o.done
	return o.max.Load()
}

type tally struct {
	ok, refused, other atomic.Int64
}

// hammer sends n concurrent requests as user, spread over the replicas.
func hammer(t *testing.T, reps []*replica, users []string, perUser int, tl *tally) {
	t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < perUser*len(users); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep := reps[i%len(reps)]
			req, _ := http.NewRequest(http.MethodGet, rep.srv.URL, nil)
			req.Header.Set("X-User", users[i%len(users)])
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				tl.other.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				tl.ok.Add(1)
			case http.StatusTooManyRequests:
				tl.refused.Add(1)
			default:
				tl.other.Add(1)
			}
		}()
	}
	wg.Wait()
}

// TestUserCapHoldsAcrossReplicas sends many concurrent requests of one user
// through three replicas (three pools) and counts the guarded queries
// running at once in pg_stat_activity: never more than the user's cap, and
// the cap is reached.
func TestUserCapHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	const perUser = 2
	reps := newReplicas(t, url, 3, 100, heavy.Endpoint{Name: "sql-console", PerUser: perUser, Time: 10 * time.Second}, nil)
	obs := observe(t, url)
	var tl tally
	for round := 0; round < 5; round++ {
		hammer(t, reps, []string{"alice"}, 24, &tl)
	}
	peak := obs.finish()
	t.Logf("ok %d, refused %d, other %d; peak running %d; observer samples %d", tl.ok.Load(), tl.refused.Load(), tl.other.Load(), peak, obs.seen.Load())
	if tl.other.Load() != 0 {
		t.Fatalf("%d requests failed otherwise than 200 or 429", tl.other.Load())
	}
	if peak > perUser {
		t.Fatalf("pg_stat_activity saw %d guarded queries of one user at once; cap %d", peak, perUser)
	}
	if peak < perUser || tl.refused.Load() == 0 {
		t.Fatalf("the test never reached the cap (peak %d, refused %d): it proves nothing", peak, tl.refused.Load())
	}
}

// TestInstallationCapHoldsAcrossUsers lets six users with a generous cap
// each run at once through three replicas: all of them together never run
// more than the installation cap.
func TestInstallationCapHoldsAcrossUsers(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	const instCap = 3
	reps := newReplicas(t, url, 3, instCap, heavy.Endpoint{Name: "audit-export", PerUser: 4, Time: 10 * time.Second}, nil)
	obs := observe(t, url)
	var tl tally
	users := []string{"u1", "u2", "u3", "u4", "u5", "u6"}
	for round := 0; round < 4; round++ {
		hammer(t, reps, users, 4, &tl)
	}
	peak := obs.finish()
	t.Logf("ok %d, refused %d, other %d; peak running %d", tl.ok.Load(), tl.refused.Load(), tl.other.Load(), peak)
	if tl.other.Load() != 0 {
		t.Fatalf("%d requests failed otherwise than 200 or 429", tl.other.Load())
	}
	if peak > instCap {
		t.Fatalf("pg_stat_activity saw %d guarded queries at once; installation cap %d", peak, instCap)
	}
	if peak < instCap {
		t.Fatalf("the test never reached the installation cap (peak %d): it proves nothing", peak)
	}
}

func decodeProblem(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body
}

// holdHandler blocks until release is closed or the request ends.
func holdHandler(started chan<- struct{}, release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	})
}

// TestRefusalBodies compares the 429 of a user's cap and of the
// installation's cap, field by field, with their headers.
func TestRefusalBodies(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	started := make(chan struct{}, 4)
	release := make(chan struct{})
	ep := heavy.Endpoint{Name: "sql-console", PerUser: 1, Time: 20 * time.Second}
	reps := newReplicas(t, url, 2, 2, ep, holdHandler(started, release))
	defer close(release)

	do := func(rep *replica, user string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodGet, rep.srv.URL+"/api/sql", nil)
		req.Header.Set("X-User", user)
		return http.DefaultClient.Do(req)
	}
	get := func(rep *replica, user string) *http.Response {
		resp, err := do(rep, user)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	go func() { _, _ = do(reps[0], "alice") }()
	<-started

	resp := get(reps[1], "alice")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	want := map[string]any{
		"type":     "urn:pglimit:problem:too-many-heavy-requests",
		"title":    "Too many heavy requests",
		"status":   float64(429),
		"detail":   "You already run 1 sql-console request(s) at once, your limit; retry when one ends.",
		"instance": "/api/sql",
		"endpoint": "sql-console",
		"limit":    float64(1),
		"scope":    "user",
	}
	if diff := cmp.Diff(want, decodeProblem(t, resp)); diff != "" {
		t.Errorf("user refusal (-want +got):\n%s", diff)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "20" && ra != "19" {
		t.Errorf("Retry-After %q, want the holder's remaining time bound (about 20)", ra)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"sql-console";q=1;qu="concurrent-requests"` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, `"sql-console";r=0;t=`) {
		t.Errorf("RateLimit %q", got)
	}

	go func() { _, _ = do(reps[1], "bob") }()
	<-started
	resp = get(reps[0], "carol")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	want["detail"] = "The installation already runs 2 heavy request(s) at once, its limit; retry when one ends."
	want["limit"] = float64(2)
	want["scope"] = "installation"
	if diff := cmp.Diff(want, decodeProblem(t, resp)); diff != "" {
		t.Errorf("installation refusal (-want +got):\n%s", diff)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"heavy-installation";q=2;qu="concurrent-requests"` {
		t.Errorf("RateLimit-Policy %q", got)
	}
}

// TestTimedOutBody runs a read that outlives its time bound before it has a
// row: 503 heavy-request-timed-out, compared field by field.
func TestTimedOutBody(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 4)
	l, err := heavy.New(pool, heavy.Options{User: userHeader})
	if err != nil {
		t.Fatal(err)
	}
	ep := heavy.Endpoint{Name: "flow-graph", Time: 300 * time.Millisecond}
	srv := httptest.NewServer(l.Handler(ep, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := heavy.Read(r.Context(), pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), "SELECT pg_sleep(5)")
			return err
		})
		if err == nil {
			t.Error("a 5 s read finished within a 300 ms bound")
		}
		heavy.WriteError(w, r, err)
	})))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/flow", nil)
	req.Header.Set("X-User", "alice")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("timed-out request took %v", took)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	want := map[string]any{
		"type":     "urn:pglimit:problem:heavy-request-timed-out",
		"title":    "Heavy request timed out",
		"status":   float64(503),
		"detail":   "The database stopped this flow-graph request at its time bound of 300ms before it had a page to return. Narrow the request (a shorter time range) and try again.",
		"instance": "/api/flow",
		"endpoint": "flow-graph",
		"bound":    "TIME",
		"limit":    "300ms",
	}
	if diff := cmp.Diff(want, decodeProblem(t, resp)); diff != "" {
		t.Errorf("timeout (-want +got):\n%s", diff)
	}
	assertNoPermits(t, pool)
}

// assertNoPermits waits briefly for the permits to be released and fails
// if any live one remains.
func assertNoPermits(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.heavy_permit`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d permits still held after the request ended", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReleasedOnPanicAndDisconnect: a handler that panics and a client that
// goes away both leave no permit behind.
func TestReleasedOnPanicAndDisconnect(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 4)
	l, err := heavy.New(pool, heavy.Options{User: userHeader})
	if err != nil {
		t.Fatal(err)
	}
	ep := heavy.Endpoint{Name: "audit-export", Time: time.Minute}

	t.Run("panic", func(t *testing.T) {
		h := l.Handler(ep, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") }))
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-User", "alice")
		func() {
			defer func() {
				if recover() == nil {
					t.Error("the panic did not reach the caller")
				}
			}()
			h.ServeHTTP(httptest.NewRecorder(), req)
		}()
		assertNoPermits(t, pool)
	})

	t.Run("disconnect", func(t *testing.T) {
		started := make(chan struct{}, 1)
		ended := make(chan struct{})
		srv := httptest.NewServer(l.Handler(ep, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			started <- struct{}{}
			<-r.Context().Done()
			close(ended)
		})))
		defer srv.Close()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		req.Header.Set("X-User", "alice")
		go func() { _, _ = http.DefaultClient.Do(req) }()
		<-started
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.heavy_permit`).Scan(&n); err != nil || n != 2 {
			t.Fatalf("while running: %d permits (want 2: user and installation), err %v", n, err)
		}
		cancel()
		<-ended
		assertNoPermits(t, pool)
	})
}

// TestAcquireOutsideHTTP uses the Check-style API a job runner would.
func TestAcquireOutsideHTTP(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 4)
	l, err := heavy.New(pool, heavy.Options{User: userHeader})
	if err != nil {
		t.Fatal(err)
	}
	ep := heavy.Endpoint{Name: "nightly", PerUser: 1, Time: time.Second}
	ctx := context.Background()
	p, err := l.Acquire(ctx, ep, "job")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctx, ep, "job")
	var le *heavy.LimitError
	if !errors.As(err, &le) || le.Scope != heavy.ScopeUser || le.Limit != 1 || !errors.Is(err, pglimit.ErrLimited) {
		t.Fatalf("second acquire: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p, err = l.Acquire(ctx, ep, "job")
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	_ = p.Release(ctx)
}

// TestBadEndpointsAndOptions are refused at construction.
func TestBadEndpointsAndOptions(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 4)
	if _, err := heavy.New(pool, heavy.Options{}); err == nil {
		t.Error("New without User: no error")
	}
	if _, err := heavy.New(pool, heavy.Options{User: userHeader, InstallationCap: -1}); err == nil {
		t.Error("New with a negative cap: no error")
	}
	if _, err := heavy.New(nil, heavy.Options{User: userHeader}); err == nil {
		t.Error("New without a pool: no error")
	}
	l, _ := heavy.New(pool, heavy.Options{User: userHeader})
	if got := l.InstallationCap(); got != 1 {
		t.Errorf("default installation cap with 4 conns = %d, want 1", got)
	}
	for name, ep := range map[string]heavy.Endpoint{
		"no name":       {},
		"negative cap":  {Name: "x", PerUser: -1},
		"negative time": {Name: "x", Time: -time.Second},
		"negative rows": {Name: "x", Rows: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := l.Acquire(context.Background(), ep, "u"); err == nil || errors.Is(err, pglimit.ErrLimited) {
				t.Errorf("Acquire(%+v) = %v, want a validation error", ep, err)
			}
			defer func() {
				if recover() == nil {
					t.Errorf("Handler(%+v) did not panic", ep)
				}
			}()
			l.Handler(ep, http.NotFoundHandler())
		})
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil) // no X-User
	rec := httptest.NewRecorder()
	l.Handler(heavy.Endpoint{Name: "x"}, http.NotFoundHandler()).ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("request without a user: %d, want 401", rec.Code)
	}
}

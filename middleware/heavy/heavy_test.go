package heavy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
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
	"github.com/pglimit/pglimit/internal/harness/activity"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

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

// newReplicas starts n replicas of the endpoint opts (Key and Replica set
// here) serving h, or a guarded read when h is nil.
func newReplicas(t *testing.T, url string, n int, opts heavy.Options, h http.Handler) []*replica {
	t.Helper()
	out := make([]*replica, n)
	for i := range out {
		pool := pgtest.Pool(t, url, 8)
		opts.Key, opts.Replica = userHeader, fmt.Sprintf("r%d", i)
		l, err := heavy.New(pool, opts)
		if err != nil {
			t.Fatal(err)
		}
		var handler http.Handler
		if h != nil {
			handler = l.Handler(h)
		} else {
			handler = l.Handler(guarded(pool))
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
	t *testing.T
	w *activity.Watcher
}

func observe(t *testing.T, url string) *observer {
	t.Helper()
	w, err := activity.Watch(context.Background(), url, guardedMarker)
	if err != nil {
		t.Fatal(err)
	}
	return &observer{t: t, w: w}
}

// finish stops the observer and returns its peak and samples; a blind
// observer fails the test.
func (o *observer) finish() (maxRunning int64, samples int) {
	o.t.Helper()
	peak, samples, err := o.w.Stop()
	if err != nil {
		o.t.Fatalf("observer: %v", err)
	}
	return int64(peak), samples
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
	reps := newReplicas(t, url, 3, heavy.Options{Name: "sql-console", Limit: perUser, Time: 10 * time.Second, InstallationLimit: 100}, nil)
	obs := observe(t, url)
	var tl tally
	for round := 0; round < 5; round++ {
		hammer(t, reps, []string{"alice"}, 24, &tl)
	}
	peak, samples := obs.finish()
	t.Logf("ok %d, refused %d, other %d; peak running %d; observer samples %d", tl.ok.Load(), tl.refused.Load(), tl.other.Load(), peak, samples)
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
	reps := newReplicas(t, url, 3, heavy.Options{Name: "audit-export", Limit: 4, Time: 10 * time.Second, InstallationLimit: instCap}, nil)
	obs := observe(t, url)
	var tl tally
	users := []string{"u1", "u2", "u3", "u4", "u5", "u6"}
	for round := 0; round < 4; round++ {
		hammer(t, reps, users, 4, &tl)
	}
	peak, _ := obs.finish()
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
	reps := newReplicas(t, url, 2, heavy.Options{Name: "sql-console", Limit: 1, Time: 20 * time.Second, InstallationLimit: 2},
		holdHandler(started, release))
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
	l, err := heavy.New(pool, heavy.Options{Name: "flow-graph", Key: userHeader, Time: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := heavy.Read(r.Context(), pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), "SELECT pg_sleep(60)")
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
	// Stopped at its bound (300 ms), not run to its end (60 s): 30 s tells
	// the two apart however loaded the machine.
	if took := time.Since(start); took > 30*time.Second {
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

// assertNoPermits waits for the permits to be released and fails if any
// live one remains after 15 s (a release takes milliseconds on a quiet
// machine; a permit not released would live its time bound + 30 s).
func assertNoPermits(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
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
	l, err := heavy.New(pool, heavy.Options{Name: "audit-export", Key: userHeader, Time: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("panic", func(t *testing.T) {
		h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") }))
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
		srv := httptest.NewServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	l, err := heavy.New(pool, heavy.Options{Name: "nightly", Key: userHeader, Limit: 1, Time: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if b := l.Bounds(); b.Endpoint != "nightly" || b.Time != time.Second {
		t.Errorf("bounds %+v", b)
	}
	_, err = l.Acquire(ctx, "job")
	var le *limit.Refusal
	if !errors.As(err, &le) || le.Scope != "user" || le.Limit != 1 || !errors.Is(err, pglimit.ErrLimited) {
		t.Fatalf("second acquire: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	p, err = l.Acquire(ctx, "job")
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	_ = p.Release(ctx)
	if _, err := l.Acquire(ctx, ""); err == nil || errors.Is(err, pglimit.ErrLimited) {
		t.Errorf("Acquire with an empty key = %v, want a validation error", err)
	}
}

// TestBadOptions are refused at construction, each with an error that
// names what is wrong; a good set is accepted and its defaults applied.
func TestBadOptions(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 4)
	good := func(edit func(*heavy.Options)) heavy.Options {
		o := heavy.Options{Name: "x", Key: userHeader}
		edit(&o)
		return o
	}
	for _, tc := range []struct {
		name string
		opts heavy.Options
		want string
	}{
		{"no name", good(func(o *heavy.Options) { o.Name = "" }), "Name"},
		{"no key", good(func(o *heavy.Options) { o.Key = nil }), "Key"},
		{"negative limit", good(func(o *heavy.Options) { o.Limit = -1 }), "Limit"},
		{"limit above MaxLimit", good(func(o *heavy.Options) { o.Limit = pglimit.MaxLimit + 1 }), "Limit"},
		{"negative installation limit", good(func(o *heavy.Options) { o.InstallationLimit = -1 }), "InstallationLimit"},
		{"installation limit above MaxLimit", good(func(o *heavy.Options) { o.InstallationLimit = pglimit.MaxLimit + 1 }), "InstallationLimit"},
		{"negative time", good(func(o *heavy.Options) { o.Time = -time.Second }), "Time"},
		{"time below a millisecond", good(func(o *heavy.Options) { o.Time = time.Microsecond }), "Time"},
		// A "no bound" of math.MaxInt64 would wrap the slot's lease
		// (Time + grace) to one lapsed before it is taken: every claim
		// would pass.
		{"time without bound", good(func(o *heavy.Options) { o.Time = math.MaxInt64 }), "Time"},
		{"time above 366 days", good(func(o *heavy.Options) { o.Time = 367 * 24 * time.Hour }), "Time"},
		{"negative rows", good(func(o *heavy.Options) { o.Rows = -1 }), "Rows"},
		{"negative timeout", good(func(o *heavy.Options) { o.Timeout = -time.Second }), "Timeout"},
		{"timeout without bound", good(func(o *heavy.Options) { o.Timeout = math.MaxInt64 }), "Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := heavy.New(pool, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error naming %s", err, tc.want)
			}
		})
	}
	if _, err := heavy.New(nil, good(func(*heavy.Options) {})); err == nil {
		t.Error("New without a pool: no error")
	}
	l, err := heavy.New(pool, good(func(o *heavy.Options) { o.Limit = pglimit.MaxLimit }))
	if err != nil {
		t.Fatalf("New at MaxLimit: %v", err)
	}
	if got := l.InstallationLimit(); got != 1 {
		t.Errorf("default installation limit with 4 conns = %d, want 1", got)
	}
}

// TestUnidentifiedPassesUncounted: a request whose key cannot be read
// reaches next without a permit, under the time bound all the same.
func TestUnidentifiedPassesUncounted(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 4)
	l, err := heavy.New(pool, heavy.Options{Name: "flow-graph", Key: userHeader, Limit: 1, Time: 7 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var (
		reached bool
		held    int
		bounds  heavy.Bounds
	)
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = true
		bounds, _ = heavy.FromContext(r.Context())
		if err := pool.QueryRow(r.Context(), `SELECT count(*) FROM pglimit.heavy_permit`).Scan(&held); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/flow", nil)) // no X-User
	if !reached || rec.Code != http.StatusNoContent {
		t.Fatalf("unidentified request: reached next %v, status %d; want it passed through", reached, rec.Code)
	}
	if held != 0 {
		t.Errorf("%d permits held while an unidentified request ran, want 0 (uncounted)", held)
	}
	if bounds.Endpoint != "flow-graph" || bounds.Time != 7*time.Second || bounds.Deadline.IsZero() {
		t.Errorf("bounds of an unidentified request %+v, want the endpoint's time bound", bounds)
	}
}

// TestOnErrorWritesEveryResponse: a refusal and a database that cannot be
// reached both go through OnError, with the error the Handler met.
func TestOnErrorWritesEveryResponse(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 4)
	var got []error
	onError := func(w http.ResponseWriter, r *http.Request, err error) {
		got = append(got, err)
		w.WriteHeader(http.StatusTeapot)
	}
	l, err := heavy.New(pool, heavy.Options{Name: "sql-console", Key: userHeader, OnError: onError})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.Acquire(context.Background(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(context.Background())
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-User", "alice")
	rec := httptest.NewRecorder()
	l.Handler(http.NotFoundHandler()).ServeHTTP(rec, req)
	if rec.Code != http.StatusTeapot || len(got) != 1 || !errors.Is(got[0], pglimit.ErrLimited) {
		t.Fatalf("refusal: status %d, OnError got %v", rec.Code, got)
	}

	closed := pgtest.Pool(t, url, 1)
	closed.Close()
	down, err := heavy.New(closed, heavy.Options{Name: "sql-console", Key: userHeader, OnError: onError, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rec = httptest.NewRecorder()
	down.Handler(http.NotFoundHandler()).ServeHTTP(rec, req)
	if rec.Code != http.StatusTeapot || len(got) != 2 || pglimit.Classify(got[1]) != pglimit.ClassUnavailable {
		t.Fatalf("database closed: status %d, OnError got %v", rec.Code, got)
	}
	rec = httptest.NewRecorder()
	heavy.WriteError(rec, req, got[1])
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "database-unavailable") {
		t.Errorf("WriteError of a closed pool: %d %s", rec.Code, rec.Body)
	}
}

// TestAnswerWaitsForAHungReleaseLessThanTimeout: the database freezes
// (SIGSTOP) while a heavy request runs inside an in-flight cap, as
// cmd/studio nests them. Its answer waits for the heavy release for as long
// as the database could still answer within the Timeout, less a
// sixteenth, and then goes out; the in-flight release, which follows in
// the same answer, does not wait a second time. Both releases go on: once
// the database answers again the user's permit and slot are free long
// before they would lapse.
func TestAnswerWaitsForAHungReleaseLessThanTimeout(t *testing.T) {
	t.Parallel()
	c := pgtest.Cluster(t)
	t.Cleanup(c.Thaw)
	ctx := context.Background()
	pool := pgtest.Pool(t, c.URL("postgres"), 4)
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const timeout = 8 * time.Second
	wait := timeout - timeout/16 // what the answer waits for a release at least
	l, err := heavy.New(pool, heavy.Options{Name: "e", Key: userHeader, Limit: 1, Time: 30 * time.Second, InstallationLimit: 4,
		Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	fl, err := inflight.New(pool, inflight.Options{Key: userHeader, Limit: 1, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	var returned time.Time
	var froze atomic.Bool
	srv := httptest.NewServer(fl.Handler(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !froze.Swap(true) {
			if err := c.Freeze(); err != nil {
				t.Error(err)
			}
			returned = time.Now()
		}
		w.WriteHeader(http.StatusOK)
	}))))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("X-User", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waited := time.Since(returned)
	c.Thaw()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// The heavy release cannot land on a frozen database: the answer waits
	// the whole wait (a timer never ends early). The in-flight release
	// that follows does not wait again: one wait, not two; the midpoint
	// between them leaves a loaded machine some seconds.
	if waited < wait || waited > wait+wait/2 {
		t.Errorf("the answer waited %v for the releases on a frozen database; want %v, one wait (Timeout %v)", waited, wait, timeout)
	}
	t.Logf("answer complete %v after the handler returned", waited.Round(10*time.Millisecond))
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's permit or slot still held 15 s after the thaw (%d): the releases did not go on", resp.StatusCode)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

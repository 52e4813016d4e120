package inflight_test

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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/inflight"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

// tokenID stands in for the application's authentication: it maps the
// bearer token to the token's id, the only thing the limiter sees.
func tokenID(r *http.Request) (string, bool) {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || raw == "" {
		return "", false
	}
	return "id-of-" + raw, true
}

func newLimiter(t testing.TB, pool *pgxpool.Pool, opts inflight.Options) *inflight.Limiter {
	t.Helper()
	if opts.Key == nil {
		opts.Key = tokenID
	}
	l, err := inflight.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Runs before the pool's own cleanup: no release is on its way when
	// the pool closes.
	t.Cleanup(func() { _ = l.Flush(context.Background()) })
	return l
}

type response struct {
	status int
	header http.Header
	body   map[string]any
}

func decode(t testing.TB, res *http.Response) response {
	t.Helper()
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := response{status: res.StatusCode, header: res.Header}
	if len(raw) > 0 && strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("body %q: %v", raw, err)
		}
	}
	return r
}

func call(t testing.TB, h http.Handler, token string) response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/api/audit", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return decode(t, rec.Result())
}

func checkRefusal(t *testing.T, got response, limit, maxRetry int) {
	t.Helper()
	if got.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", got.status)
	}
	retry, err := strconv.Atoi(got.header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > maxRetry {
		t.Fatalf("Retry-After %q, want 1..%d", got.header.Get("Retry-After"), maxRetry)
	}
	want := map[string]any{
		"type":       "urn:pglimit:problem:too-many-requests-in-flight",
		"title":      "Too many requests in flight",
		"status":     float64(429),
		"detail":     fmt.Sprintf("This token already has %d requests in flight, its limit; retry when one ends.", limit),
		"instance":   "/api/audit",
		"limit":      float64(limit),
		"retryAfter": float64(retry),
	}
	if diff := cmp.Diff(want, got.body); diff != "" {
		t.Errorf("refusal body (-want +got):\n%s", diff)
	}
}

// peak keeps the highest value it was shown.
type peak struct{ v atomic.Int64 }

func (p *peak) see(n int64) {
	for {
		cur := p.v.Load()
		if n <= cur || p.v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// rowObserver polls request_in_flight from a connection of its own and
// keeps the most live rows of scope it saw at once.
func rowObserver(t *testing.T, url, scope string) (max *peak, stop func()) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	max = &peak{}
	done := make(chan struct{})
	quit := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		for {
			select {
			case <-quit:
				return
			default:
			}
			var n int64
			if err := conn.QueryRow(context.Background(),
				`SELECT count(*) FROM pglimit.request_in_flight WHERE scope = $1 AND expires_at > now()`, scope).Scan(&n); err == nil {
				max.see(n)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return max, func() { close(quit); <-done }
}

func liveRows(t testing.TB, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pglimit.request_in_flight WHERE scope = $1 AND expires_at > now()`, inflight.Scope(key)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCapHoldsAcrossReplicas sends bursts of one token's requests through
// three replicas (three pools). Two independent observers — the handlers
// counting themselves running, and a separate connection counting the
// token's rows — never see more than the limit at once, and both see it
// reached.
func TestCapHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	const limit = 3
	var running atomic.Int64
	handlerPeak := &peak{}
	work := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlerPeak.see(running.Add(1))
		time.Sleep(40 * time.Millisecond)
		running.Add(-1)
		w.WriteHeader(http.StatusOK)
	})
	var servers []*httptest.Server
	for i := 0; i < 3; i++ {
		pool := pgtest.Pool(t, url, 8)
		srv := httptest.NewServer(newLimiter(t, pool, inflight.Options{Limit: limit, Replica: fmt.Sprint("r", i)}).Handler(work))
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
	}
	rowPeak, stop := rowObserver(t, url, inflight.Scope("id-of-alice-token"))
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		refusals []response
	)
	for round := 0; round < 5; round++ {
		var wg sync.WaitGroup
		for i := 0; i < 24; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest(http.MethodGet, servers[i%3].URL+"/api/audit", nil)
				req.Header.Set("Authorization", "Bearer alice-token")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				got := decode(t, res)
				mu.Lock()
				defer mu.Unlock()
				statuses[got.status]++
				if got.status == http.StatusTooManyRequests {
					refusals = append(refusals, got)
				}
			}()
		}
		wg.Wait()
	}
	stop()
	t.Logf("statuses %v; peak running in handlers %d, peak rows %d", statuses, handlerPeak.v.Load(), rowPeak.v.Load())
	if statuses[200]+statuses[429] != 120 {
		t.Fatalf("statuses %v", statuses)
	}
	if h, r := handlerPeak.v.Load(), rowPeak.v.Load(); h > limit || r > limit {
		t.Fatalf("peak in handlers %d, peak rows %d: above the limit %d", h, r, limit)
	} else if h < limit || r < limit || statuses[429] == 0 {
		t.Fatalf("the limit was never reached (handlers %d, rows %d, refused %d): the test proves nothing", h, r, statuses[429])
	}
	for _, r := range refusals {
		checkRefusal(t, r, limit, 150)
	}
	if n := liveRows(t, pgtest.Pool(t, url, 1), "id-of-alice-token"); n != 0 {
		t.Fatalf("%d rows left after every request ended", n)
	}
}

// TestReleasedOnPanicAndDisconnect: a handler that panics and a client
// that goes away both free their slot at once (the release leaves when
// the handler ends; Flush waits for it to land).
func TestReleasedOnPanicAndDisconnect(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	var mode atomic.Value
	started := make(chan struct{}, 1)
	ended := make(chan struct{}, 1)
	l := newLimiter(t, pool, inflight.Options{Limit: 1})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "panic":
			panic("handler bug")
		case "wait":
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second): // a broken limiter must fail the test, not hang it
			}
			select {
			case ended <- struct{}{}:
			default:
			}
		}
	}))
	mode.Store("panic")
	for i := 0; i < 3; i++ {
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the panic was swallowed")
				}
			}()
			call(t, h, "bob-token")
		}()
		// The release left when the handler panicked; Flush waits for it.
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := liveRows(t, pool, "id-of-bob-token"); n != 0 {
			t.Fatalf("after a panic %d rows are held", n)
		}
	}

	mode.Store("wait")
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/audit", nil)
	req.Header.Set("Authorization", "Bearer bob-token")
	go func() {
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	<-started
	if n := liveRows(t, pool, "id-of-bob-token"); n != 1 {
		t.Fatalf("while the request runs %d rows, want 1", n)
	}
	checkRefusal(t, call(t, h, "bob-token"), 1, 150)
	cancel()
	<-ended
	deadline := time.Now().Add(5 * time.Second)
	for liveRows(t, pool, "id-of-bob-token") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the slot of a client that went away was not released")
		}
		time.Sleep(10 * time.Millisecond)
	}
	mode.Store("")
	if got := call(t, h, "bob-token"); got.status != http.StatusOK {
		t.Fatalf("after the disconnect: %d", got.status)
	}
}

// TestVanishedHolderLapses: a replica that dies holding a slot (its pool
// closed without a release) holds it until MaxDuration + grace on the
// database clock, and not longer. The real grace is 30 s; the test
// shortens it.
func TestVanishedHolderLapses(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	dying := pgtest.Pool(t, url, 1)
	alive := pgtest.Pool(t, url, 1)
	const (
		maxDur = 300 * time.Millisecond
		grace  = 400 * time.Millisecond
	)
	opts := inflight.Options{Key: tokenID, Limit: 1, MaxDuration: maxDur}
	dl, err := inflight.NewWithGrace(dying, opts, grace)
	if err != nil {
		t.Fatal(err)
	}
	al, err := inflight.NewWithGrace(alive, opts, grace)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dl.Acquire(context.Background(), "id-of-carol-token"); err != nil {
		t.Fatal(err)
	}
	claimed := time.Now()
	dying.Close() // the replica is gone; its slot was never released
	h := al.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	checkRefusal(t, call(t, h, "carol-token"), 1, 1)
	for {
		got := call(t, h, "carol-token")
		if got.status == http.StatusOK {
			break
		}
		checkRefusal(t, got, 1, 1)
		if time.Since(claimed) > maxDur+grace+2*time.Second {
			t.Fatalf("slot still held %v after the claim", time.Since(claimed))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if waited := time.Since(claimed); waited < maxDur+grace-100*time.Millisecond {
		t.Fatalf("slot free after %v, before MaxDuration + grace = %v", waited, maxDur+grace)
	}
}

// TestLeaseIsMaxDurationPlus30s reads a live row: it lapses 30 s after the
// request's maximum duration; the handler's context ends at MaxDuration.
func TestLeaseIsMaxDurationPlus30s(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	const maxDur = 45 * time.Second
	var lease time.Duration
	var deadline time.Duration
	h := newLimiter(t, pool, inflight.Options{MaxDuration: maxDur}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := r.Context().Deadline()
		deadline = time.Until(d)
		var ms int64
		if err := pool.QueryRow(r.Context(), `SELECT (extract(epoch FROM expires_at - claimed_at) * 1000)::bigint FROM pglimit.request_in_flight`).Scan(&ms); err != nil {
			t.Error(err)
		}
		lease = time.Duration(ms) * time.Millisecond
	}))
	if got := call(t, h, "dave-token"); got.status != http.StatusOK {
		t.Fatalf("status %d", got.status)
	}
	if lease != maxDur+30*time.Second {
		t.Errorf("lease %v, want %v", lease, maxDur+30*time.Second)
	}
	if deadline > maxDur || deadline < maxDur-5*time.Second {
		t.Errorf("handler deadline in %v, want about %v", deadline, maxDur)
	}
}

// TestUnidentifiedPassesUncounted: a request without a token identity
// reaches next as it is, holding no slot, even when every slot of the cap
// is taken.
func TestUnidentifiedPassesUncounted(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	l := newLimiter(t, pool, inflight.Options{Limit: 1})
	p, err := l.Acquire(context.Background(), "id-of-") // a full scope nobody's key can reach
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(context.Background())
	for _, token := range []string{"", " ", "Bearer "} {
		var held int
		reached := false
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached = true
			if _, ok := r.Context().Deadline(); ok {
				t.Errorf("token %q: an unidentified request got a MaxDuration deadline", token)
			}
			if err := pool.QueryRow(r.Context(), `SELECT count(*) FROM pglimit.request_in_flight`).Scan(&held); err != nil {
				t.Error(err)
			}
			w.WriteHeader(http.StatusNoContent)
		}))
		req := httptest.NewRequest(http.MethodGet, "/api/session", nil)
		if token != "" {
			req.Header.Set("Authorization", token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if !reached || rec.Code != http.StatusNoContent {
			t.Errorf("token %q: reached next %v, status %d; want it passed through", token, reached, rec.Code)
		}
		if held != 1 {
			t.Errorf("token %q: %d slots held while it ran, want only the one taken before (uncounted)", token, held)
		}
	}
}

// TestBadOptions are refused by New, each with an error naming what is
// wrong; the defaults of a good set are applied.
func TestBadOptions(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	for _, tc := range []struct {
		name string
		opts inflight.Options
		want string
	}{
		{"no key", inflight.Options{}, "Key"},
		{"negative limit", inflight.Options{Key: tokenID, Limit: -2}, "Limit"},
		{"limit above MaxLimit", inflight.Options{Key: tokenID, Limit: pglimit.MaxLimit + 1}, "Limit"},
		{"negative duration", inflight.Options{Key: tokenID, MaxDuration: -time.Second}, "MaxDuration"},
		{"tiny duration", inflight.Options{Key: tokenID, MaxDuration: time.Microsecond}, "MaxDuration"},
		{"duration without bound", inflight.Options{Key: tokenID, MaxDuration: math.MaxInt64}, "MaxDuration"},
		{"keep without bound", inflight.Options{Key: tokenID, Keep: math.MaxInt64}, "Keep"},
		{"negative timeout", inflight.Options{Key: tokenID, Timeout: -time.Second}, "Timeout"},
		{"negative keep", inflight.Options{Key: tokenID, Keep: -time.Second}, "Keep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := inflight.New(pool, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error naming %s", err, tc.want)
			}
		})
	}
	if _, err := inflight.New(nil, inflight.Options{Key: tokenID}); err == nil {
		t.Error("New accepted a nil pool")
	}
	l := newLimiter(t, pool, inflight.Options{})
	if l.Limit() != 8 || l.MaxDuration() != 2*time.Minute || l.Name() != "in-flight" {
		t.Errorf("defaults %d %v %q", l.Limit(), l.MaxDuration(), l.Name())
	}
	if _, err := inflight.New(pool, inflight.Options{Key: tokenID, Limit: pglimit.MaxLimit}); err != nil {
		t.Errorf("New at MaxLimit: %v", err)
	}
}

// TestOnErrorWritesEveryResponse: a refusal and a database that cannot be
// reached both go through OnError.
func TestOnErrorWritesEveryResponse(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewDB(t, 2)
	var got []error
	onError := func(w http.ResponseWriter, r *http.Request, err error) {
		got = append(got, err)
		w.WriteHeader(http.StatusTeapot)
	}
	l := newLimiter(t, pool, inflight.Options{Limit: 1, OnError: onError})
	p, err := l.Acquire(context.Background(), "id-of-alice-token")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(context.Background())
	h := l.Handler(http.NotFoundHandler())
	if res := call(t, h, "alice-token"); res.status != http.StatusTeapot || len(got) != 1 || !errors.Is(got[0], pglimit.ErrLimited) {
		t.Fatalf("refusal: %d, OnError got %v", res.status, got)
	}
	closed := pgtest.Pool(t, url, 1)
	closed.Close()
	down := newLimiter(t, closed, inflight.Options{OnError: onError, Logger: slog.New(slog.DiscardHandler)})
	if res := call(t, down.Handler(http.NotFoundHandler()), "alice-token"); res.status != http.StatusTeapot || len(got) != 2 ||
		pglimit.Classify(got[1]) != pglimit.ClassUnavailable {
		t.Fatalf("database closed: %d, OnError got %v", res.status, got)
	}
	rec := httptest.NewRecorder()
	inflight.WriteError(rec, httptest.NewRequest(http.MethodGet, "/", nil), got[1])
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "database-unavailable") {
		t.Errorf("WriteError of a closed pool: %d %s", rec.Code, rec.Body)
	}
}

// TestAcquireAPI: the non-HTTP Acquire and Release.
func TestAcquireAPI(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	l := newLimiter(t, pool, inflight.Options{Limit: 1, MaxDuration: 10 * time.Second})
	ctx := context.Background()
	p, err := l.Acquire(ctx, "job-runner")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctx, "job-runner")
	var le *limit.Refusal
	if !errors.Is(err, pglimit.ErrLimited) || !errors.As(err, &le) {
		t.Fatalf("second acquire: %v", err)
	}
	// A moment: requests in flight end at any time (at most 2 s, not the
	// first slot's lapse, 10 s + grace away).
	if le.Limit != 1 || le.RetryAfter < time.Second || le.RetryAfter > 2*time.Second {
		t.Fatalf("refusal %+v", le)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "job-runner"); err != nil {
		t.Fatalf("after release: %v", err)
	}
	if _, err := l.Acquire(ctx, ""); err == nil {
		t.Fatal("empty key accepted")
	}
}

// TestTokenKey never stores the raw token.
func TestTokenKey(t *testing.T) {
	t.Parallel()
	k := inflight.TokenKey("alice-token")
	if strings.Contains(k, "alice-token") || !strings.HasPrefix(k, "sha256:") || len(k) != len("sha256:")+32 {
		t.Fatalf("TokenKey = %q", k)
	}
	if k == inflight.TokenKey("bob-token") || k != inflight.TokenKey("alice-token") {
		t.Fatal("TokenKey is not a function of the token")
	}
}

// TestEndpointFromHostilePath: a path a client wrote with NUL, bytes that
// are not UTF-8, or a great length is still a request the limiter counts
// (PostgreSQL text refuses NUL and invalid UTF-8, which was a 500); behind
// a ServeMux the slot names the route's pattern, never the client's text.
func TestEndpointFromHostilePath(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	l := newLimiter(t, pool, inflight.Options{Limit: 4})
	var seen []string
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var endpoint string
		if err := pool.QueryRow(r.Context(), `SELECT endpoint FROM pglimit.request_in_flight WHERE holder = 'id-of-t'`).Scan(&endpoint); err != nil {
			t.Error(err)
		}
		seen = append(seen, endpoint)
	})
	mux := http.NewServeMux()
	mux.Handle("GET /api/nodes/{node}/queues", l.Handler(inner))
	bare := l.Handler(inner)
	for _, path := range []string{"/api/nodes/%00/queues", "/api/nodes/%ff%fe/queues", "/api/nodes/" + strings.Repeat("n", 5000) + "/queues"} {
		for _, h := range []http.Handler{mux, bare} {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.Header.Set("Authorization", "Bearer t")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Fatalf("%.40s: %d %s", path, rec.Code, rec.Body)
			}
		}
	}
	for i, e := range seen {
		if i%2 == 0 && e != "GET /api/nodes/{node}/queues" {
			t.Errorf("behind the mux the slot says %q, want the pattern", e)
		}
		if strings.ContainsRune(e, 0) || !utf8.ValidString(e) || len(e) > 200 {
			t.Errorf("stored endpoint %.60q", e)
		}
	}
}

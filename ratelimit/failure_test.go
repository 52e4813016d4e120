package ratelimit_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/ratelimit"
)

// proxy stands between the limiter's pool and PostgreSQL, so a test can
// make the database unreachable (connections refused and cut) or hang
// (connections accepted, nothing answered), and bring it back.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	mode   string // "up", "down", "hang"
	conns  map[net.Conn]struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, mode: "up", conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); p.set("down") })
	go p.serve()
	return p
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		mode := p.mode
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		switch mode {
		case "down":
			c.Close()
		case "hang":
			// Keep it open and silent until the mode changes.
		default:
			go p.pipe(c)
		}
	}
}

func (p *proxy) pipe(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[s] = struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(s, c); s.Close() }()
	_, _ = io.Copy(c, s)
	c.Close()
}

// set changes the mode and cuts every connection made so far.
func (p *proxy) set(mode string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// throughProxy is a fresh test database's URL, through a proxy.
func throughProxy(t *testing.T) (string, *proxy) {
	t.Helper()
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, u.Host)
	u.Host = p.ln.Addr().String()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String(), p
}

// TestFailClosed: while the database cannot be reached every request is
// 503 database-unavailable with Retry-After; the incident is logged once
// when it begins and once when the database answers again, and counted
// once, while every failed decision is counted.
func TestFailClosed(t *testing.T) {
	t.Parallel()
	u, px := throughProxy(t)
	pool := pgtest.Pool(t, u, 2)
	logs := &logBuffer{}
	meter := observetest.New()
	h := newLimiter(t, pool, options{
		Policies:      []ratelimit.Policy{{Name: "api", Limit: 100, Window: time.Second}},
		Logger:        slog.New(slog.NewTextHandler(logs, nil)),
		MeterProvider: meter,
	}).Handler(ok)
	if a := get(t, h, "t"); a.status != http.StatusOK {
		t.Fatalf("up: %d", a.status)
	}
	px.set("down")
	for i := range 10 {
		a := get(t, h, "t")
		if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
			t.Fatalf("down, request %d: %d %v", i+1, a.status, a.body)
		}
		if typ, _ := a.body["type"].(string); typ != "urn:pglimit:problem:"+"database-unavailable" {
			t.Errorf("type %q", typ)
		}
	}
	px.set("up")
	if a := get(t, h, "t"); a.status != http.StatusOK {
		t.Fatalf("up again: %d %v", a.status, a.body)
	}
	if n := logs.Count("cannot be reached"); n != 1 {
		t.Errorf("%d incident lines, want 1:\n%s", n, logs)
	}
	if n := logs.Count("succeed again"); n != 1 || logs.Count("failed_requests=10") != 1 {
		t.Errorf("recovery lines:\n%s", logs)
	}
	want := map[string]int64{
		"pglimit.decisions/granted": 2, "pglimit.decisions/error": 10, "pglimit.ratelimit.incidents/closed": 1,
	}
	if diff := cmp.Diff(want, decisions(t, meter)); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

// TestFailOpen: with FailOpen, requests pass uncounted and without
// headers while the database cannot be reached, and a database that hangs
// fails the decision at Timeout instead of holding the request.
//
// Each time the database is up the pool is given a connection before the
// request (connected is a ping), so the decision's Timeout bounds one
// statement on a live connection, not a connection's setup through the
// proxy as well: a loaded machine could take longer than the Timeout for
// both, and the limiter would rightly fail open.
func TestFailOpen(t *testing.T) {
	t.Parallel()
	u, px := throughProxy(t)
	pool := pgtest.Pool(t, u, 2)
	connected := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A connection the proxy cut fails its ping and leaves the pool.
		for err := pool.Ping(ctx); err != nil; err = pool.Ping(ctx) {
			if ctx.Err() != nil {
				t.Fatalf("the database is up, but the pool cannot connect: %v", err)
			}
		}
	}
	logs := &logBuffer{}
	meter := observetest.New()
	h := newLimiter(t, pool, options{
		Policies:      []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour}},
		FailOpen:      true,
		Timeout:       time.Second,
		Logger:        slog.New(slog.NewTextHandler(logs, nil)),
		MeterProvider: meter,
	}).Handler(ok)
	connected()
	if a := get(t, h, "t"); a.status != http.StatusOK || a.header.Get("RateLimit") == "" {
		t.Fatalf("up: %d %v", a.status, a.header)
	}
	for _, mode := range []string{"down", "hang"} {
		px.set(mode)
		for i := range 5 {
			a := get(t, h, "t")
			if a.status != http.StatusOK || a.header.Get("RateLimit") != "" {
				t.Fatalf("%s, request %d: %d %v: want a pass without headers", mode, i+1, a.status, a.header)
			}
		}
		px.set("up")
		connected()
		if a := get(t, h, "t"); a.status != http.StatusTooManyRequests {
			t.Fatalf("up again after %s: %d: the rate of 1/h was spent before", mode, a.status)
		}
	}
	if n := logs.Count("fail open"); n != 2 {
		t.Errorf("%d incident lines for two incidents:\n%s", n, logs)
	}
	want := map[string]int64{
		"pglimit.decisions/granted": 1, "pglimit.decisions/refused": 2, "pglimit.decisions/error": 10,
		"pglimit.ratelimit.incidents/open": 2,
	}
	if diff := cmp.Diff(want, decisions(t, meter)); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

// TestClientGone: a client that went away is neither an incident nor
// answered.
func TestClientGone(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 1)
	logs := &logBuffer{}
	l := newLimiter(t, pool, options{Policies: []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour}},
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/api/things", nil)
	r.Header.Set("Authorization", "Bearer t")
	w := httptest.NewRecorder()
	reached := false
	l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true })).ServeHTTP(w, r)
	if reached || w.Body.Len() != 0 || w.Header().Get("Content-Type") != "" {
		t.Errorf("client gone: reached %v, answered %q", reached, w.Body.String())
	}
	if logs.String() != "" {
		t.Errorf("logged: %s", logs)
	}
}

// TestFailOpenIsTheEngines: the engine decides fail-open, so every
// transport (and a job calling AcquireN) gets the same answer: with
// FailOpen, a database that cannot be reached gives a Permit that spent
// nothing and carries no policy state; without it, the database's error;
// and a caller that went away gets its error either way, never a pass.
func TestFailOpenIsTheEngines(t *testing.T) {
	t.Parallel()
	u, px := throughProxy(t)
	pool := pgtest.Pool(t, u, 2)
	policies := []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour}}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	open, err := ratelimit.New(pool, ratelimit.Options{Name: "open", Policies: policies, FailOpen: true, Timeout: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	closed, err := ratelimit.New(pool, ratelimit.Options{Name: "closed", Policies: policies, Timeout: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	px.set("down")
	ctx := context.Background()
	p, err := open.AcquireN(ctx, "k", 1, nil)
	if err != nil || p == nil || p.Cost != 0 || len(p.Policies) != 0 || p.Refusal() != nil {
		t.Fatalf("FailOpen, database down: %+v, %v; want a Permit that spent nothing", p, err)
	}
	if err := p.Settle(ctx, 5); err != nil {
		t.Errorf("settling a fail-open permit: %v; want nothing to settle", err)
	}
	if p, err := closed.AcquireN(ctx, "k", 1, nil); p != nil || pglimit.Classify(err) != pglimit.ClassUnavailable {
		t.Errorf("fail closed, database down: %+v, %v (%s); want the database's error", p, err, pglimit.Classify(err))
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if p, err := open.AcquireN(gone, "k", 1, nil); p != nil || err == nil {
		t.Errorf("FailOpen, caller gone: %+v, %v; want its error", p, err)
	}
}

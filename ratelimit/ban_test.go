package ratelimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/ban"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/ratelimit"
)

// statements counts the statements a pool sends on pglimit's limit tables.
// statements counts the statements of the limit tables and of bans that a
// request ran: those whose context is a request's the tests sent (marked
// by fromRequest), the statement carrying it even when it goes on past the
// request (context.WithoutCancel keeps values). The ban memory's reload
// runs in the background on a context of its own: work of the replica,
// not of a request, and on a loaded machine it may run late, while the
// requests a test judges are being answered.
type statements struct{ n atomic.Int64 }

// fromRequest marks the context of a request the tests sent.
type fromRequest struct{}

// markRequest returns r with its context marked fromRequest.
func markRequest(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), fromRequest{}, true))
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if ctx.Value(fromRequest{}) == nil {
		return ctx
	}
	if strings.Contains(d.SQL, "pglimit.api_request_window") || strings.Contains(d.SQL, "pglimit.ban") ||
		strings.Contains(d.SQL, "pglimit.rate_") {
		s.n.Add(1)
	}
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// bannedReplica is a replica of a service whose requests name their user
// in X-User, rate-limited with bans.
type bannedReplica struct {
	h     http.Handler
	l     *limiter
	stmts *statements
	meter *observetest.Meter
}

func bannedReplicas(t *testing.T, n int, rule ban.Options, policy ratelimit.Policy) []*bannedReplica {
	t.Helper()
	url := pgtest.URL(t)
	var out []*bannedReplica
	var pools []*pgxpool.Pool
	for range n {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 4
		st := &statements{}
		cfg.ConnConfig.Tracer = st
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		bans, err := ban.New(pool, rule)
		if err != nil {
			t.Fatal(err)
		}
		m := observetest.New()
		l, err := build(pool, options{
			Key: func(r *http.Request) (string, bool) {
				u := r.Header.Get("X-User")
				return "user:" + u, u != ""
			},
			Policies: []ratelimit.Policy{policy}, Ban: bans,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MeterProvider: m,
		})
		if err != nil {
			t.Fatal(err)
		}
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
		out = append(out, &bannedReplica{h: h, l: l, stmts: st, meter: m})
		pools = append(pools, pool)
	}
	pgtest.Listen(t, pools...)
	// Each replica reads the live bans once its bus is up (in the
	// background, on its first request): let that read be done.
	for _, r := range out {
		r.get(t, "warm-up")
	}
	time.Sleep(500 * time.Millisecond)
	return out
}

// get sends a request of user to r and returns the status and the
// problem type's slug.
func (r *bannedReplica) get(t *testing.T, user string) (int, string, *httptest.ResponseRecorder) {
	t.Helper()
	req := markRequest(httptest.NewRequest(http.MethodGet, "/api/x", nil))
	req.Header.Set("X-User", user)
	w := httptest.NewRecorder()
	r.h.ServeHTTP(w, req)
	var body struct{ Type string }
	if w.Code != http.StatusNoContent {
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%d %s: %v", w.Code, w.Body, err)
		}
	}
	slug := body.Type[strings.LastIndexAny(body.Type, "/:")+1:]
	return w.Code, slug, w
}

// TestBannedBeforeAnyStatement: a user refused by the rate After times is
// answered 429 banned, with Retry-After and retryAfter, on every replica,
// before any statement (a tracer on each pool counts none), counted with
// outcome banned; another user is served all along; Acquire says Banned.
func TestBannedBeforeAnyStatement(t *testing.T) {
	t.Parallel()
	rs := bannedReplicas(t, 2, ban.Options{After: 3, Within: time.Minute, For: time.Minute},
		ratelimit.Policy{Name: "api", Limit: 2, Window: time.Minute})
	// mallory spends the burst and is refused three times: banned.
	var slugs []string
	for range 5 {
		_, slug, _ := rs[0].get(t, "mallory")
		slugs = append(slugs, slug)
	}
	if got := strings.Join(slugs, ","); got != ",,too-many-requests,too-many-requests,banned" {
		t.Fatalf("mallory's answers: %s", got)
	}
	deadline := time.Now().Add(time.Second)
	for {
		if _, slug, _ := rs[1].get(t, "mallory"); slug == "banned" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("mallory is not banned on the other replica within a second")
		}
		time.Sleep(5 * time.Millisecond)
	}
	before := []int64{rs[0].stmts.n.Load(), rs[1].stmts.n.Load()}
	if before[0] == 0 {
		t.Fatal("the tracer saw no statement of mallory's requests: it would see none of the banned ones either")
	}
	for i, r := range rs {
		for range 500 {
			code, slug, w := r.get(t, "mallory")
			if code != http.StatusTooManyRequests || slug != "banned" {
				t.Fatalf("replica %d: %d %s", i, code, slug)
			}
			retry, err := strconv.Atoi(w.Header().Get("Retry-After"))
			if err != nil || retry < 1 || retry > 60 {
				t.Fatalf("Retry-After %q", w.Header().Get("Retry-After"))
			}
			var body struct{ RetryAfter int }
			_ = json.Unmarshal(w.Body.Bytes(), &body)
			if body.RetryAfter != retry {
				t.Fatalf("retryAfter %d, Retry-After %d", body.RetryAfter, retry)
			}
		}
		if n := r.stmts.n.Load() - before[i]; n != 0 {
			t.Errorf("replica %d: %d statements for 500 requests of a banned user, want 0", i, n)
		}
		if got := r.meter.Decisions(t)["api banned key"]; got < 500 {
			t.Errorf("replica %d: %d decisions with outcome banned, want at least 500", i, got)
		}
	}
	// Alice shares nothing of it.
	for i, r := range rs {
		if code, slug, _ := r.get(t, "alice"); code != http.StatusNoContent {
			t.Errorf("replica %d: alice answered %d %s", i, code, slug)
		}
	}
	_, err := rs[1].l.Acquire(context.Background(), "user:mallory")
	var le *ratelimit.LimitError
	if !errors.As(err, &le) || !le.Banned || !errors.Is(err, pglimit.ErrLimited) || le.RetryAfter <= 0 {
		t.Errorf("Acquire of a banned key: %v", err)
	}
}

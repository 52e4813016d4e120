package ratelimit_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit/harness/observetest"
	"github.com/pglimit/pglimit/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/ratelimit"
)

// TestExempt: a request Options.Exempt exempts passes however often,
// uncounted (no row, no statement), without RateLimit headers, counted in
// pglimit.decisions with outcome exempt; the same key without the
// exemption is held to its rate as before, and finds nothing spent.
func TestExempt(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	meter := observetest.New()
	l := newLimiter(t, pool, ratelimit.Options{
		Policies:      []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour}},
		Exempt:        func(r *http.Request) bool { return r.Header.Get("X-Allowed") == "yes" },
		MeterProvider: meter,
	})
	h := l.Handler(ok)
	for i := range 20 {
		a := get(t, h, "alice", "X-Allowed", "yes")
		if a.status != http.StatusOK {
			t.Fatalf("exempt request %d: %d", i, a.status)
		}
		if a.header.Get("RateLimit") != "" || a.header.Get("RateLimit-Policy") != "" {
			t.Fatalf("exempt request %d has RateLimit headers: %v", i, a.header)
		}
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.api_request_window`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("exempt requests wrote %d rows", rows)
	}
	if a := get(t, h, "alice"); a.status != http.StatusOK || a.header.Get("RateLimit") == "" {
		t.Errorf("the key's first counted request: %d %v", a.status, a.header)
	}
	if a := get(t, h, "alice"); a.status != http.StatusTooManyRequests {
		t.Errorf("the key's second counted request: %d, want 429", a.status)
	}
	if a := get(t, h, "alice", "X-Allowed", "yes"); a.status != http.StatusOK {
		t.Errorf("exempt while refused: %d", a.status)
	}
	want := map[string]int64{"api exempt key": 21, "api granted key": 1, "api refused key": 1}
	if diff := cmp.Diff(want, meter.Decisions(t)); diff != "" {
		t.Errorf("decisions (-want +got):\n%s", diff)
	}
}

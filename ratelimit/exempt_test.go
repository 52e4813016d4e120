package ratelimit_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/ban"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/ratelimit"
)

// TestExempt: a request Options.Exempt exempts passes however often,
// uncounted (no row, no statement), without RateLimit headers, counted in
// pglimit.decisions with outcome exempt; the same key without the
// exemption is held to its rate as before, and finds nothing spent.
func TestExempt(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	meter := observetest.New()
	l := newLimiter(t, pool, options{
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

// TestExemptFromBans: a banned key that Options.Exempt exempts passes,
// with no statement (a tracer on the pool counts those of the limit
// tables and of pglimit.ban), counted with outcome exempt, never banned;
// the same key without the exemption is still refused 429 banned. A key
// only ever exempted never counts a refusal toward a ban: it has no row
// in pglimit.ban.
func TestExemptFromBans(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
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
	pgtest.Listen(t, pool)
	bans, err := ban.New(pool, ban.Options{After: 2, Within: time.Minute, For: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	meter := observetest.New()
	h := newLimiter(t, pool, options{
		Policies:      []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour}},
		Exempt:        func(r *http.Request) bool { return r.Header.Get("X-Allowed") == "yes" },
		Ban:           bans,
		MeterProvider: meter,
	}).Handler(ok)
	slug := func(a answer) string {
		typ, _ := a.body["type"].(string)
		return typ[strings.LastIndexAny(typ, "/:")+1:]
	}
	var got []string
	for range 4 {
		a := get(t, h, "mallory")
		got = append(got, fmt.Sprintf("%d %s", a.status, slug(a)))
	}
	if diff := cmp.Diff([]string{"200 ", "429 too-many-requests", "429 banned", "429 banned"}, got); diff != "" {
		t.Fatalf("mallory's answers (-want +got):\n%s", diff)
	}
	before := st.n.Load()
	if before == 0 {
		t.Fatal("the tracer saw no statement of mallory's requests: it would see none of the exempt ones either")
	}
	for i := range 50 {
		if a := get(t, h, "mallory", "X-Allowed", "yes"); a.status != http.StatusOK || a.header.Get("RateLimit") != "" {
			t.Fatalf("banned but exempt, request %d: %d %v %v", i, a.status, a.header, a.body)
		}
		if a := get(t, h, "trent", "X-Allowed", "yes"); a.status != http.StatusOK {
			t.Fatalf("trent, exempt, request %d: %d %v", i, a.status, a.body)
		}
	}
	if n := st.n.Load() - before; n != 0 {
		t.Errorf("100 exempt requests ran %d statements of the limit tables and bans, want 0", n)
	}
	if a := get(t, h, "mallory"); a.status != http.StatusTooManyRequests || slug(a) != "banned" {
		t.Errorf("mallory without the exemption: %d %v, want 429 banned", a.status, a.body)
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.ban WHERE key LIKE '%trent%'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("a key only ever exempted has %d rows in pglimit.ban", rows)
	}
	// The refusal that bans is counted refused; the requests of the key
	// banned after it, banned.
	want := map[string]int64{"api granted key": 1, "api refused key": 2, "api banned key": 2, "api exempt key": 100}
	if diff := cmp.Diff(want, meter.Decisions(t)); diff != "" {
		t.Errorf("decisions (-want +got):\n%s", diff)
	}
}

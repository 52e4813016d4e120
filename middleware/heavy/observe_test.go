package heavy_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/permit"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/heavy"
)

// TestMetrics: every decision is counted by limit, outcome and scope, every
// claim and release is timed, and the refusals reach the installation's
// count per minute.
func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := pgtest.NewDB(t, 4)
	m := observetest.New()
	console, err := heavy.New(pool, heavy.Options{Name: "sql-console", Key: userHeader, Limit: 1, InstallationLimit: 5, MeterProvider: m})
	if err != nil {
		t.Fatal(err)
	}
	export, err := heavy.New(pool, heavy.Options{Name: "audit-export", Key: userHeader, Limit: 1, InstallationLimit: 1, MeterProvider: m})
	if err != nil {
		t.Fatal(err)
	}
	p, err := console.Acquire(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	var le *limit.Refusal
	if _, err := console.Acquire(ctx, "alice"); !errors.As(err, &le) || le.Scope != "user" {
		t.Fatalf("second claim of alice: %v", err)
	}
	if _, err := export.Acquire(ctx, "bob"); !errors.As(err, &le) || le.Scope != "installation" {
		t.Fatalf("bob over an installation cap of 1: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The release's duration is recorded when its round trip ends (Release
	// waited for it; Flush is a no-op then).
	if err := console.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// A database that cannot be reached: the decision is an error.
	closed := pgtest.Pool(t, url, 1)
	closed.Close()
	broken, err := heavy.New(closed, heavy.Options{Name: "flow-graph", Key: userHeader, MeterProvider: m})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := broken.Acquire(ctx, "carol"); err == nil || errors.Is(err, pglimit.ErrLimited) {
		t.Fatalf("claim on a closed pool: %v", err)
	}

	want := map[string]int64{
		"sql-console granted user":          1,
		"sql-console refused user":          1,
		"audit-export refused installation": 1,
		"flow-graph error user":             1,
	}
	if diff := cmp.Diff(want, m.Decisions(t)); diff != "" {
		t.Errorf("pglimit.decisions (-want +got):\n%s", diff)
	}
	wantDur := map[string]uint64{"sql-console claim": 2, "sql-console release": 1, "audit-export claim": 1, "flow-graph claim": 1}
	if diff := cmp.Diff(wantDur, m.Durations(t)); diff != "" {
		t.Errorf("pglimit.decision.duration observations (-want +got):\n%s", diff)
	}
	observetest.WaitRefusals(t, pool, map[string]int64{"sql-console": 1, "audit-export": 1})
}

// TestDryRun: a request the limit would refuse runs without a permit, with
// the headers of its refusal, counted dry-run-refused and logged; granted
// requests hold their permits as usual, so the decisions stay true.
func TestDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewDB(t, 4)
	m := observetest.New()
	logs := &observetest.Logs{}
	l, err := heavy.New(pool, heavy.Options{Name: "sql-console", Key: userHeader, Limit: 1, DryRun: true,
		MeterProvider: m, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	held, err := l.Acquire(ctx, "alice")
	if err != nil || held.Refusal() != nil {
		t.Fatalf("first claim: %v, refusal %v", err, held.Refusal())
	}
	var ran, rowsWhileRunning int
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		if _, ok := heavy.FromContext(r.Context()); !ok {
			t.Error("a dry-run request runs without its bounds")
		}
		rows, err := db.New().SlotList(r.Context(), pool, string(permit.HeavyPermit))
		if err != nil {
			t.Error(err)
		}
		rowsWhileRunning = len(rows)
		w.WriteHeader(http.StatusNoContent)
	}))
	serve := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/api/sql", nil)
		req.Header.Set("X-User", "alice")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := serve()
	if rec.Code != http.StatusNoContent || ran != 1 {
		t.Fatalf("a would-be refusal in dry run: %d, handler ran %d times", rec.Code, ran)
	}
	if got := rec.Header().Get("RateLimit-Policy"); got != `"sql-console";q=1;qu="concurrent-requests"` {
		t.Errorf("RateLimit-Policy %q: the refusal's headers", got)
	}
	if got := rec.Header().Get("RateLimit"); got == "" || got[:len(`"sql-console";r=0;`)] != `"sql-console";r=0;` {
		t.Errorf("RateLimit %q: the refusal's headers", got)
	}
	if rowsWhileRunning != 2 {
		t.Errorf("%d permit rows while the dry-run request ran; want the held pair only (user and installation)", rowsWhileRunning)
	}
	if logs.Count("dry run: would refuse") != 1 || logs.Count("key=alice") != 1 {
		t.Errorf("dry-run log: %q", logs.String())
	}
	p, err := l.Acquire(ctx, "alice")
	if err != nil || p.Refusal() == nil || p.Refusal().Scope != "user" || p.Release(ctx) != nil {
		t.Fatalf("Acquire in dry run over the cap: %v; want a Permit carrying the refusal", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rec = serve()
	if rec.Code != http.StatusNoContent || rec.Header().Get("RateLimit-Policy") != "" {
		t.Errorf("with the permit free: %d %v", rec.Code, rec.Header())
	}
	if rowsWhileRunning != 2 {
		t.Errorf("%d permit rows while a granted request ran in dry run, want its own 2", rowsWhileRunning)
	}
	want := map[string]int64{"sql-console granted user": 2, "sql-console dry-run-refused user": 2}
	if diff := cmp.Diff(want, m.Decisions(t)); diff != "" {
		t.Errorf("pglimit.decisions (-want +got):\n%s", diff)
	}
	observetest.WaitRefusals(t, pool, map[string]int64{"sql-console dry-run": 2})
}

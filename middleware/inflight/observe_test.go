package inflight_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/permit"
	"github.com/pglimit/pglimit/middleware/inflight"
)

// TestMetricsAndDryRun: every decision is counted by limit, outcome and
// scope and every claim and release timed; in dry run a request over the
// cap runs without a slot, counted dry-run-refused and logged, while
// granted requests hold their slots as usual; refusals of both reach the
// installation's count per minute.
func TestMetricsAndDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := pgtest.NewDB(t, 4)
	m := observetest.New()
	logs := &observetest.Logs{}

	l := newLimiter(t, pool, inflight.Options{Limit: 1, MeterProvider: m})
	p, err := l.Acquire(ctx, "id-of-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "id-of-a"); !errors.Is(err, pglimit.ErrLimited) {
		t.Fatalf("second request of a: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := call(t, l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})), ""); r.status != http.StatusOK {
		t.Fatalf("unidentified: %d", r.status)
	}
	closed := pgtest.Pool(t, url, 1)
	closed.Close()
	if _, err := newLimiter(t, closed, inflight.Options{MeterProvider: m}).Acquire(ctx, "id-of-a"); err == nil {
		t.Fatal("a claim on a closed pool succeeded")
	}

	dry := newLimiter(t, pool, inflight.Options{Name: "in-flight-dry", Limit: 1, DryRun: true, MeterProvider: m, Logger: logs.Logger()})
	held, err := dry.Acquire(ctx, "id-of-b")
	if err != nil || held.Refusal() != nil {
		t.Fatalf("first claim in dry run: %v", err)
	}
	var rows int
	h := dry.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held, err := db.New().SlotList(r.Context(), pool, string(permit.RequestInFlight))
		if err != nil {
			t.Error(err)
		}
		rows = len(held)
	}))
	if r := call(t, h, "b"); r.status != http.StatusOK || rows != 1 {
		t.Fatalf("over the cap in dry run: %d with %d rows held; want 200 and only the held slot", r.status, rows)
	}
	if logs.Count("dry run: would refuse") != 1 || logs.Count("key=id-of-b") != 1 {
		t.Errorf("dry-run log: %q", logs.String())
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := call(t, h, "b"); r.status != http.StatusOK || rows != 1 {
		t.Fatalf("under the cap in dry run: %d with %d rows; want its own slot", r.status, rows)
	}

	// A release's duration is recorded when its round trip ends, which no
	// caller waits for: see them land first.
	for _, lim := range []*inflight.Limiter{l, dry} {
		if err := lim.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int64{
		"in-flight granted token": 1, "in-flight refused token": 1, "in-flight error token": 1,
		"in-flight-dry granted token": 2, "in-flight-dry dry-run-refused token": 1,
	}
	if diff := cmp.Diff(want, m.Decisions(t)); diff != "" {
		t.Errorf("pglimit.decisions (-want +got):\n%s", diff)
	}
	wantDur := map[string]uint64{"in-flight claim": 3, "in-flight release": 1, "in-flight-dry claim": 3, "in-flight-dry release": 2}
	if diff := cmp.Diff(wantDur, m.Durations(t)); diff != "" {
		t.Errorf("pglimit.decision.duration observations (-want +got):\n%s", diff)
	}
	observetest.WaitRefusals(t, pool, map[string]int64{"in-flight": 1, "in-flight-dry dry-run": 1})
}

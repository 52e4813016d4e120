package upload_test

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
	"github.com/pglimit/pglimit/middleware/upload"
)

// TestMetricsAndDryRun: every decision is counted by limit, outcome and
// scope and every claim and release timed; in dry run an upload over the
// window's limit is stored without a slot (it is not counted in the
// window, as it would not have been with the limit on), counted
// dry-run-refused and logged; refusals of both reach the installation's
// count per minute.
func TestMetricsAndDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := pgtest.NewDB(t, 4)
	m := observetest.New()
	logs := &observetest.Logs{}

	l := newLimiter(t, pool, upload.Options{Limit: 1, MeterProvider: m})
	h := l.Handler(&plugins{})
	if r := send(t, h, "alice", "bad"); r.status != http.StatusBadRequest {
		t.Fatalf("a rejected file: %d", r.status) // granted, then given back
	}
	if r := send(t, h, "alice", "plugin"); r.status != http.StatusCreated {
		t.Fatalf("first upload: %d", r.status)
	}
	if r := send(t, h, "alice", "plugin"); r.status != http.StatusTooManyRequests {
		t.Fatalf("second upload: %d", r.status)
	}
	closed := pgtest.Pool(t, url, 1)
	closed.Close()
	if _, err := newLimiter(t, closed, upload.Options{MeterProvider: m}).Acquire(ctx, "alice"); err == nil || errors.Is(err, pglimit.ErrLimited) {
		t.Fatalf("a claim on a closed pool: %v", err)
	}

	dry := newLimiter(t, pool, upload.Options{Name: "uploads-dry", Limit: 1, DryRun: true, MeterProvider: m, Logger: logs.Logger()})
	store := &plugins{}
	hd := dry.Handler(store)
	for i := range 3 {
		if r := send(t, hd, "bob", "plugin"); r.status != http.StatusCreated {
			t.Fatalf("upload %d in dry run: %d", i+1, r.status)
		}
	}
	if store.stored.Load() != 3 {
		t.Errorf("%d uploads stored in dry run, want 3", store.stored.Load())
	}
	slots, err := db.New().SlotList(ctx, pool, string(permit.UploadWindow))
	if err != nil {
		t.Fatal(err)
	}
	if n := countScope(slots, upload.Scope("bob")); n != 1 {
		t.Errorf("%d of bob's uploads in the window after dry run, want 1: the others would have been refused", n)
	}
	if p, err := dry.Acquire(ctx, "bob"); err != nil || p.Refusal() == nil || p.Release(ctx) != nil {
		t.Fatalf("Acquire over the limit in dry run: %v; want a Permit carrying the refusal", err)
	}
	if logs.Count("dry run: would refuse") != 1 || logs.Count("key=bob") != 1 {
		t.Errorf("dry-run log: %q", logs.String())
	}

	// A release's duration is recorded when its round trip ends: Flush
	// sees every one land before the counts are read.
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"uploads granted user": 2, "uploads refused user": 1, "uploads error user": 1,
		"uploads-dry granted user": 1, "uploads-dry dry-run-refused user": 3,
	}
	if diff := cmp.Diff(want, m.Decisions(t)); diff != "" {
		t.Errorf("pglimit.decisions (-want +got):\n%s", diff)
	}
	wantDur := map[string]uint64{"uploads claim": 4, "uploads release": 1, "uploads-dry claim": 4}
	if diff := cmp.Diff(wantDur, m.Durations(t)); diff != "" {
		t.Errorf("pglimit.decision.duration observations (-want +got):\n%s", diff)
	}
	observetest.WaitRefusals(t, pool, map[string]int64{"uploads": 1, "uploads-dry dry-run": 3})
}

func countScope(slots []*db.SlotListRow, scope string) int {
	n := 0
	for _, s := range slots {
		if s.Scope == scope {
			n++
		}
	}
	return n
}

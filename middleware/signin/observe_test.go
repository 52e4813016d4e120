package signin_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/signin"
)

// TestMetricsAndDryRun: every decision is counted by limit, outcome and
// scope, every check and record timed; in dry run, in both modes, a
// throttled username's sign-in is evaluated, counted dry-run-refused and
// logged, its failure recorded and its success clearing the key; refusals
// reach the installation's count per minute.
func TestMetricsAndDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := pgtest.NewDB(t, 4)
	m := observetest.New()
	logs := &observetest.Logs{}

	a := newApp(t, "alice", "bob", "carol")
	h := newLimiter(t, pool, signin.Options{Lenient: true, Limit: 2, MeterProvider: m}).Handler(a)
	for i, want := range []int{401, 401, 429} {
		if r := signIn(t, h, "alice", "wrong"); r.status != want {
			t.Fatalf("attempt %d: %d, want %d", i+1, r.status, want)
		}
	}
	closed := pgtest.Pool(t, url, 1)
	closed.Close()
	if _, err := newLimiter(t, closed, signin.Options{Lenient: true, MeterProvider: m}).Acquire(ctx, "alice"); err == nil || errors.Is(err, pglimit.ErrLimited) {
		t.Fatalf("a check on a closed pool: %v", err)
	}

	for _, mode := range []struct {
		name   string
		user   string
		strict bool
	}{{"sign-in-dry", "bob", false}, {"sign-in-strict-dry", "carol", true}} {
		before := a.evaluated.Load()
		hd := newLimiter(t, pool, signin.Options{Name: mode.name, Limit: 2, Lenient: !mode.strict, DryRun: true,
			MeterProvider: m, Logger: logs.Logger()}).Handler(a)
		for i := range 3 {
			if r := signIn(t, hd, mode.user, "wrong"); r.status != http.StatusUnauthorized {
				t.Fatalf("%s: wrong password %d: %d, want 401", mode.name, i+1, r.status)
			}
		}
		if n := failures(t, pool, "username:"+mode.user); n != 3 {
			t.Errorf("%s: %d failures counted, want 3: the one over the limit is recorded too", mode.name, n)
		}
		if r := signIn(t, hd, mode.user, rightPassword); r.status != http.StatusOK {
			t.Fatalf("%s: right password of a throttled user in dry run: %d", mode.name, r.status)
		}
		if n := failures(t, pool, "username:"+mode.user); n != 0 {
			t.Errorf("%s: %d failures after a success, want them cleared", mode.name, n)
		}
		if n := a.evaluated.Load() - before; n != 4 {
			t.Errorf("%s: %d passwords checked, want all 4", mode.name, n)
		}
	}
	if logs.Count("dry run: would refuse") != 2 || logs.Count("key=username:bob") != 1 || logs.Count("key=username:carol") != 1 {
		t.Errorf("dry-run log (a line a second per limiter): %q", logs.String())
	}

	want := map[string]int64{
		"sign-in granted user": 2, "sign-in refused user": 1, "sign-in error user": 1,
		"sign-in-dry granted user": 2, "sign-in-dry dry-run-refused user": 2,
		"sign-in-strict-dry granted user": 2, "sign-in-strict-dry dry-run-refused user": 2,
	}
	if diff := cmp.Diff(want, m.Decisions(t)); diff != "" {
		t.Errorf("pglimit.decisions (-want +got):\n%s", diff)
	}
	// Records: normal mode writes each failure and the clear; strict mode
	// only the unreserved failure over the limit and the clear (a
	// reservation is the check itself).
	wantDur := map[string]uint64{
		"sign-in check": 4, "sign-in record": 2,
		"sign-in-dry check": 4, "sign-in-dry record": 4,
		"sign-in-strict-dry check": 4, "sign-in-strict-dry record": 2,
	}
	if diff := cmp.Diff(wantDur, m.Durations(t)); diff != "" {
		t.Errorf("pglimit.decision.duration observations (-want +got):\n%s", diff)
	}
	observetest.WaitRefusals(t, pool, map[string]int64{"sign-in": 1, "sign-in-dry dry-run": 2, "sign-in-strict-dry dry-run": 2})
}

package observe_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/observe"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// countingDB is the real database, with its statements counted and, while
// fail is set, refused before they are sent.
type countingDB struct {
	db.DBTX
	execs atomic.Int64
	fail  atomic.Bool
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.execs.Add(1)
	if c.fail.Load() {
		return pgconn.CommandTag{}, errors.New("refused by the test")
	}
	return c.DBTX.Exec(ctx, sql, args...)
}

// TestRefusalsAreBatched: a burst of refusals from many goroutines is
// counted exactly, in the metric and in the installation's table, and
// written in a few statements, not one per refusal; a write that fails
// keeps its count for the next.
func TestRefusalsAreBatched(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	cdb := &countingDB{DBTX: pool}
	m := observetest.New()
	logs := &observetest.Logs{}
	l, err := observe.New(observe.Options{Name: "api", Scopes: []string{"key"}, MeterProvider: m, Logger: logs.Logger(), DB: cdb})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for range 50 {
				l.Refused(ctx, "key", "k")
			}
		})
	}
	wg.Wait()
	observetest.WaitRefusals(t, pool, map[string]int64{"api": 1000})
	elapsed := time.Since(start)
	if n := cdb.execs.Load(); n > int64(elapsed/time.Second)+2 {
		t.Errorf("%d writes for 1000 refusals in %v: want about one a second", n, elapsed)
	}
	if diff := cmp.Diff(map[string]int64{"api refused key": 1000}, m.Decisions(t)); diff != "" {
		t.Errorf("decisions (-want +got):\n%s", diff)
	}

	// A failed write: the count waits for the next one.
	cdb.fail.Store(true)
	l.Refused(ctx, "key", "k")
	deadline := time.Now().Add(10 * time.Second)
	for logs.Count("refusals per minute not written") == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if logs.Count("refusals per minute not written") != 1 {
		t.Fatalf("a failed write is not logged: %q", logs.String())
	}
	cdb.fail.Store(false)
	l.Refused(ctx, "key", "k")
	observetest.WaitRefusals(t, pool, map[string]int64{"api": 1002})
}

// TestDryRunLetsThrough: in dry run Refused says let it through, counts
// dry-run-refused, logs at most a line a second with the key, and keeps
// the refusals apart from real ones.
func TestDryRunLetsThrough(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	m := observetest.New()
	logs := &observetest.Logs{}
	l, err := observe.New(observe.Options{Name: "uploads", Scopes: []string{"user"}, DryRun: true, MeterProvider: m, Logger: logs.Logger(), DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if !l.DryRun() {
		t.Fatal("a limit in dry run says it refuses")
	}
	for range 3 {
		l.Refused(ctx, "user", "alice", "cap", 5)
	}
	l.Granted(ctx, "user")
	l.Failed(ctx, "user", errors.New("database down"))
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	l.Failed(canceled, "user", context.Canceled) // a client that left: not counted
	want := map[string]int64{"uploads dry-run-refused user": 3, "uploads granted user": 1, "uploads error user": 1}
	if diff := cmp.Diff(want, m.Decisions(t)); diff != "" {
		t.Errorf("decisions (-want +got):\n%s", diff)
	}
	if logs.Count("dry run: would refuse") != 1 || logs.Count("key=alice") != 1 || logs.Count("cap=5") != 1 {
		t.Errorf("dry-run lines: %q", logs.String())
	}
	observetest.WaitRefusals(t, pool, map[string]int64{"uploads dry-run": 3})
}

// TestRecent: the minutes are the last n of the database clock, oldest
// first, and every limit's counts sit at their minute.
func TestRecent(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	ctx := context.Background()
	// One transaction: now() stays one instant, so no minute turns over
	// between the writes and the read.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Rows written as the limiters write them, at minutes the test picks.
	for _, r := range []struct {
		name   string
		ago    int
		dryRun bool
		n      int64
	}{{"sign-in", 0, false, 3}, {"sign-in", 2, false, 4}, {"sign-in", 2, true, 1}, {"api", 14, false, 7}, {"api", 15, false, 100}} {
		if _, err := tx.Exec(ctx, `INSERT INTO pglimit.refusal_minute (name, minute, dry_run, refusals, expires_at)
			VALUES ($1, date_trunc('minute', now()) - interval '1 minute' * $2, $3, $4, now() + interval '1 hour')`,
			r.name, r.ago, r.dryRun, r.n); err != nil {
			t.Fatal(err)
		}
	}
	got, err := observe.Recent(ctx, tx, 15)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Minutes) != 15 || got.Minutes[14].Sub(got.Minutes[0]) != 14*time.Minute || got.Minutes[14].Second() != 0 {
		t.Fatalf("minutes %v", got.Minutes)
	}
	z := func(at map[int]int64) []int64 {
		out := make([]int64, 15)
		for i, n := range at {
			out[i] = n
		}
		return out
	}
	want := []observe.LimitMinutes{
		{Name: "api", Refused: z(map[int]int64{0: 7}), DryRunRefused: z(nil)},
		{Name: "sign-in", Refused: z(map[int]int64{12: 4, 14: 3}), DryRunRefused: z(map[int]int64{12: 1})},
	}
	if diff := cmp.Diff(want, got.Limits); diff != "" {
		t.Errorf("limits (-want +got):\n%s", diff)
	}
	for _, n := range []int{0, 61} {
		if _, err := observe.Recent(ctx, tx, n); err == nil {
			t.Errorf("Recent over %d minutes: no error", n)
		}
	}
	empty, _ := pgtest.NewDB(t, 1)
	none, err := observe.Recent(ctx, empty, 5)
	if err != nil || len(none.Minutes) != 5 || len(none.Limits) != 0 {
		t.Errorf("no refusals: %+v, %v", none, err)
	}
}

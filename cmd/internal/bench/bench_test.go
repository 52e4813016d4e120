package bench

import (
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// benchRows is the page fixture's size: DefaultRows, or BENCH_EVENT_ROWS,
// or 20,000 under -short.
func benchRows(tb testing.TB) int {
	if s := os.Getenv("BENCH_EVENT_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 100 {
			tb.Fatalf("BENCH_EVENT_ROWS=%q: want a number of at least 100", s)
		}
		return n
	}
	if testing.Short() {
		return 20_000
	}
	return DefaultRows
}

func newSuite(tb testing.TB, rows int) *Suite {
	tb.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(tb, pgtest.URL(tb), 24)
	if rows > 0 {
		if _, err := BuildEvents(ctx, pool, rows); err != nil {
			tb.Fatal(err)
		}
	}
	s, err := NewSuite(ctx, pool, rows, redisAddr())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// BenchmarkLimits runs every limit path beside the baselines (SELECT 1 on
// the same pool, an in-process semaphore, redis_rate when Redis answers),
// in parallel (-cpu sets the goroutines: e.g. -cpu 1,16).
func BenchmarkLimits(b *testing.B) {
	s := newSuite(b, 0)
	if s.redis == nil {
		b.Log(s.RedisNote)
	}
	for _, p := range append(s.Baselines(), s.Limits()...) {
		b.Run(benchName(p.Name), func(b *testing.B) { runParallel(b, p) })
	}
}

// BenchmarkRequests sends whole HTTP requests through each middleware
// chain a user would build (httptest server, keep-alive client, real pool)
// beside the same handler alone (-cpu sets the goroutines: e.g. -cpu 1,16).
func BenchmarkRequests(b *testing.B) {
	s := newSuite(b, 0)
	requests, stop, err := s.Requests()
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	for _, p := range requests {
		b.Run(benchName(p.Name), func(b *testing.B) { runParallel(b, p) })
	}
}

// BenchmarkPages reads a 50-row page at each depth by keyset and by OFFSET
// over the 2,000,000-row fixture (BENCH_EVENT_ROWS; 20,000 under -short),
// with SELECT 1 as the floor.
func BenchmarkPages(b *testing.B) {
	s := newSuite(b, benchRows(b))
	pages, err := s.Pages(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range append(s.Baselines()[:1], pages...) {
		b.Run(benchName(p.Name), func(b *testing.B) { runParallel(b, p) })
	}
}

// TestPathsRun runs every path a few times, as the benchmarks and
// cmd/benchreport do, so that a path that fails (a refusal where none is
// expected, a page that does not match) fails `go test`.
func TestPathsRun(t *testing.T) {
	t.Parallel()
	s := newSuite(t, 2_000)
	pages, err := s.Pages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) != 2 { // only depth 0 fits in 2,000 rows: keyset and OFFSET
		t.Fatalf("%d page paths, want 2", len(pages))
	}
	requests, stop, err := s.Requests()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, p := range append(append(append(s.Baselines(), s.Limits()...), pages...), requests...) {
		r, err := Measure(context.Background(), 4, 0, 20, p.New)
		if err != nil {
			t.Errorf("%s: %v", p.Name, err)
			continue
		}
		if r.Ops < 20 || r.P50 <= 0 || r.P99 < r.P50 {
			t.Errorf("%s: %+v", p.Name, r)
		}
	}
}

// TestHeavyPathHoldsItsCap: the heavy path's limiter is a real one — a
// third permit of one user on the bench endpoint (per-user cap 2) is
// refused — so the benchmark measures grants, not a limiter that lets
// everything through.
func TestHeavyPathHoldsItsCap(t *testing.T) {
	t.Parallel()
	s := newSuite(t, 0)
	ctx := context.Background()
	for i := range 2 {
		if _, err := s.heavy.Acquire(ctx, "one"); err != nil {
			t.Fatalf("permit %d: %v", i+1, err)
		}
	}
	if _, err := s.heavy.Acquire(ctx, "one"); err == nil {
		t.Fatal("a third permit of a cap of 2 was granted")
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		in   []time.Duration
		p    int
		want time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 50, 7 * time.Millisecond},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(1, 2), 50, time.Millisecond},
		{ms(1, 2, 3), 50, 2 * time.Millisecond},
		{ms(hundred...), 50, 50 * time.Millisecond},
		{ms(hundred...), 99, 99 * time.Millisecond},
		{ms(hundred...), 100, 100 * time.Millisecond},
	} {
		if got := Percentile(tc.in, tc.p); got != tc.want {
			t.Errorf("p%d of %v = %v, want %v", tc.p, tc.in, got, tc.want)
		}
	}
}

// TestMeasure: every client runs, at least minOps are done, and an error
// stops the measurement and is returned.
func TestMeasure(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	r, err := Measure(context.Background(), 3, 20*time.Millisecond, 30, func(int) (Op, error) {
		return func(context.Context) error { calls.Add(1); time.Sleep(time.Millisecond); return nil }, nil
	})
	if err != nil || r.Ops < 30 || r.Clients != 3 || r.Throughput() <= 0 || r.P50 < time.Millisecond {
		t.Fatalf("%+v %v", r, err)
	}
	if int64(r.Ops)+3 != calls.Load() { // each client's warm-up is not recorded
		t.Fatalf("%d ops recorded, %d calls", r.Ops, calls.Load())
	}
	boom := context.DeadlineExceeded
	var n atomic.Int64
	_, err = Measure(context.Background(), 2, time.Second, 0, func(int) (Op, error) {
		return func(context.Context) error {
			if n.Add(1) > 10 {
				return boom
			}
			return nil
		}, nil
	})
	if err != boom {
		t.Fatalf("error %v, want %v", err, boom)
	}
}

// TestNoDBCases runs every no-database allocation case: each checks its
// answer, and none reaches the database (whose pools point at no server).
// Not parallel: testing.AllocsPerRun, the cross-check, refuses to be.
func TestNoDBCases(t *testing.T) {
	cases, cleanup, err := NoDBCases()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	for _, c := range cases {
		start := time.Now()
		a := AllocsPerRun(50, c.Run)
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s took %v: did it dial the database?", c.Name, took)
		}
		got := testing.AllocsPerRun(50, c.Run)
		if a < 0 || got < 0 || (a == 0) != (got == 0) {
			t.Errorf("%s: %v allocations, testing.AllocsPerRun says %v", c.Name, a, got)
		}
		t.Logf("%-28s %6.1f allocs/op", c.Name, a)
	}
}

package ratelimit_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/bench"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// BenchmarkWholeRequestBorrowed measures what the rate limit, borrowing,
// adds to a whole HTTP request through the reference service's chain (the
// rate limit, then the in-flight cap), beside the in-flight cap alone and
// the handler alone, at 1 client: each iteration sends one request through
// each chain in turn, so the machine's other work falls on all three
// alike. It reports each chain's p50 and added_ratio: what the chain with
// the rate limit adds to the handler alone (p50) over what the in-flight
// cap alone adds (issue 19's goal: at most 1.10).
func BenchmarkWholeRequestBorrowed(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.Pool(b, pgtest.URL(b), 8)
	s, err := bench.NewSuite(ctx, pool, 0, "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	paths, stop, err := s.Requests()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	names := []string{bench.NameRequestAlone, bench.NameRequestInflight, bench.NameRequestAPIBorrowed}
	ops := make([]bench.Op, len(names))
	for i, name := range names {
		k := slices.IndexFunc(paths, func(p bench.Path) bool { return p.Name == name })
		if k < 0 {
			b.Fatalf("no path %q", name)
		}
		if ops[i], err = paths[k].New(0); err != nil {
			b.Fatal(err)
		}
	}
	run := func(i int) time.Duration {
		t := time.Now()
		if err := ops[i](ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(t)
	}
	for range 300 { // connections open, statements prepared, the key hot
		for i := range ops {
			run(i)
		}
	}
	lat := make([][]time.Duration, len(ops))
	for b.Loop() {
		for i := range ops {
			lat[i] = append(lat[i], run(i))
		}
	}
	p50 := make([]float64, len(ops))
	for i := range lat {
		slices.Sort(lat[i])
		p50[i] = float64(lat[i][len(lat[i])/2].Nanoseconds())
	}
	b.ReportMetric(p50[0], "alone-p50-ns")
	b.ReportMetric(p50[1], "inflight-p50-ns")
	b.ReportMetric(p50[2], "borrowed+inflight-p50-ns")
	b.ReportMetric((p50[2]-p50[0])/(p50[1]-p50[0]), "added_ratio")
}

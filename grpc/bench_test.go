package pglimitgrpc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pglimitgrpc "github.com/pglimit/pglimit/grpc"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/ratelimit"
)

// BenchmarkCall is one unary call over loopback TCP from one client: bare
// (no interceptor), under the rate limit (one statement per call: a rate
// no call reaches, no borrowing) and under the in-flight cap (a claim and
// a release per call). The rate and in-flight rows report x-bare, their
// time per call over the bare call's measured in the same run (run bare
// first: go test -bench Call, as its sub-benchmarks are ordered).
func BenchmarkCall(b *testing.B) {
	pool, _ := pgtest.NewDB(b, 8)
	rl := newRate(b, pool, ratelimit.Options{Name: "bench", Policies: []ratelimit.Policy{{Name: "api", Limit: 1_000_000, Window: time.Second}}})
	capper, err := inflight.New(pool, inflight.Options{Name: "bench", Key: noHTTP, Limit: 64})
	if err != nil {
		b.Fatal(err)
	}
	var bare float64 // ns per bare call, this run
	for _, bc := range []struct {
		name string
		i    []*pglimitgrpc.Interceptor
	}{
		{"bare", nil},
		{"rate", []*pglimitgrpc.Interceptor{must(pglimitgrpc.RateLimit(rl, pglimitgrpc.Options{Key: tenant}))}},
		{"inflight", []*pglimitgrpc.Interceptor{must(pglimitgrpc.InFlight(capper, pglimitgrpc.Options{Key: tenant}))}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			client := serve(b, nil, bc.i...)
			ctx := as(context.Background(), fmt.Sprintf("bench-%d", time.Now().UnixNano()))
			req := &healthpb.HealthCheckRequest{}
			if _, err := client.Check(ctx, req); err != nil { // connect first
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := client.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if bc.name == "bare" {
				bare = per
			} else if bare > 0 {
				b.ReportMetric(per/bare, "x-bare")
			}
		})
	}
}

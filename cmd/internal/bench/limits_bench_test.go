package bench

// The benchmarks of the limits' packages (go test -bench . ./cmd/internal/bench/):
// each limit's paths beside the floors of the same run (Package), and the
// whole request through the reference service's chain.

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// BenchmarkRateLimit measures a rate-limit decision under one policy and
// under two (all or nothing), at 1 and 16 clients beside SELECT 1, the
// one-row upsert and redis_rate Allow measured in the same run (see
// Package).
func BenchmarkRateLimit(b *testing.B) { Package(b, NameRateLimit, NameRateLimit2) }

// BenchmarkBannedRefusal measures a banned key's refusal (Options.Ban:
// from memory, before the rate) beside the rate's own refusal from memory
// and the floors, at 1 and 16 clients.
func BenchmarkBannedRefusal(b *testing.B) { Package(b, NameFromMemory, NameBanned) }

// BenchmarkInFlight measures a token's in-flight slot, claimed and
// released (inflight.Limiter.Acquire + Permit.Release), at 1 and 16
// clients beside the floors.
func BenchmarkInFlight(b *testing.B) { Package(b, "in-flight claim+release") }

// BenchmarkUpload measures an upload's claim of a slot in its user's
// window (upload.Limiter.Acquire, kept as a successful upload keeps it),
// at 1 and 16 clients beside the floors.
func BenchmarkUpload(b *testing.B) { Package(b, "upload claim") }

// BenchmarkQuota runs the calendar quota's paths beside the baselines of
// the same run: its charge beside the one-row upsert and the rate
// decision, a charge settled after the fact, and the charge in the
// caller's transaction beside a logged one-row upsert in a transaction.
func BenchmarkQuota(b *testing.B) {
	Package(b, NameQuota, NameQuotaSettle, NameQuotaTx, NameRateLimit)
}

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
	s, err := NewSuite(ctx, pool, 0, "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	paths, stop, err := s.Requests()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	names := []string{NameRequestAlone, NameRequestInflight, NameRequestAPIBorrowed}
	ops := make([]Op, len(names))
	for i, name := range names {
		k := slices.IndexFunc(paths, func(p Path) bool { return p.Name == name })
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

package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// Package is the benchmark of one limit's package (inflight, upload,
// ratelimit; heavy and signin have their own): the named limit paths of Suite.Limits beside
// the floors measured in the same run — SELECT 1 and the one-row upsert on
// the same pool, and redis_rate Allow when Redis answers — at 1 and 16
// concurrent clients, each its own user, token or key. Read the ratios
// from ns/op: clients=1/SELECT-1-floor is the floor; `make bench` (cmd/
// benchreport) reports the same paths as p50 and throughput ratios.
func Package(b *testing.B, names ...string) {
	b.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(b, pgtest.URL(b), 24)
	s, err := NewSuite(ctx, pool, 0, redisAddr())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	if s.redis == nil {
		b.Log(s.RedisNote)
	}
	var paths []Path
	for _, p := range s.Baselines() {
		if p.Name != NameSemaphore {
			paths = append(paths, p)
		}
	}
	for _, p := range s.Limits() {
		if slices.Contains(names, p.Name) {
			paths = append(paths, p)
		}
	}
	if len(paths) == len(s.Baselines())-1 {
		b.Fatalf("bench: no limit path named %q", names)
	}
	for _, clients := range []int{1, 16} {
		for _, p := range paths {
			b.Run(fmt.Sprintf("clients=%d/%s", clients, benchName(p.Name)), func(b *testing.B) {
				if clients == 1 {
					runOne(b, p)
					return
				}
				// RunParallel starts parallelism × GOMAXPROCS goroutines.
				b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
				runParallel(b, p)
			})
		}
	}
}

// runOne runs path p's op in one loop: one client.
func runOne(b *testing.B, p Path) {
	b.Helper()
	op, err := p.New(1)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	ctx := context.Background()
	for b.Loop() {
		if err := op(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func redisAddr() string {
	if a := os.Getenv("BENCH_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// runParallel runs path p's ops under b.RunParallel, each goroutine with
// the op of its own loop (its own user, token, key).
func runParallel(b *testing.B, p Path) {
	b.Helper()
	var worker atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		op, err := p.New(int(worker.Add(1)))
		if err != nil {
			b.Error(err)
			return
		}
		ctx := context.Background()
		for pb.Next() {
			if err := op(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func benchName(s string) string {
	return strings.NewReplacer(" ", "-", "(", "", ")", "", "@", "depth=").Replace(s)
}

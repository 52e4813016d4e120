// Package bench measures pglimit's paths side by side with the baselines a
// team would compare them with, in the same run on the same machine: a
// SELECT 1 round trip on the same pool (the floor of anything counted in
// PostgreSQL), an in-process semaphore (what a single replica would use) and
// go-redis/redis_rate on a local Redis (what a team would pick instead).
//
// It is shared by the Go benchmarks of this package (go test -bench) and by
// cmd/benchreport, which runs its own measured loops — go test -bench gives
// a mean, not percentiles — and writes BENCHMARKS.md with a chart.
//
// The SQL in this package is a benchmark fixture (a history-shaped table
// and the two page queries the cursor package tells a handler to run, as
// in cursor/bench_test.go), not an API: what is measured is PostgreSQL's
// plan for each shape. Everything pglimit runs goes through its packages.
package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Op is one request of a path. It is called from one goroutine at a time.
type Op func(ctx context.Context) error

// Result is what a measured loop saw.
type Result struct {
	// Clients is the number of concurrent loops.
	Clients int
	// Ops is the number of operations completed.
	Ops int
	// Elapsed is the wall time from the first start to the last end.
	Elapsed time.Duration
	// P50, P99 are latency percentiles of single operations.
	P50, P99 time.Duration
	// Mean is the mean latency.
	Mean time.Duration
}

// Throughput is operations per second over all clients.
func (r Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// Measure runs clients loops of the ops newOp makes (one per loop) for d,
// and at least minOps operations in all, recording the latency of every
// operation. Each loop runs its op once first, unrecorded (connections
// dialled, caches warm). A loop stops at the first error; Measure returns
// it.
func Measure(ctx context.Context, clients int, d time.Duration, minOps int, newOp func(worker int) (Op, error)) (Result, error) {
	ops := make([]Op, clients)
	for i := range ops {
		op, err := newOp(i)
		if err != nil {
			return Result{}, err
		}
		if err := op(ctx); err != nil {
			return Result{}, fmt.Errorf("warm-up: %w", err)
		}
		ops[i] = op
	}
	lat := make([][]time.Duration, clients)
	errs := make([]error, clients)
	var done sync.WaitGroup
	var total int64
	var mu sync.Mutex
	start := time.Now()
	deadline := start.Add(d)
	perClient := (minOps + clients - 1) / clients
	for i := range ops {
		done.Add(1)
		go func() {
			defer done.Done()
			own := make([]time.Duration, 0, 1024)
			for len(own) < perClient || time.Now().Before(deadline) {
				if ctx.Err() != nil {
					errs[i] = ctx.Err()
					break
				}
				t := time.Now()
				if err := ops[i](ctx); err != nil {
					errs[i] = err
					break
				}
				own = append(own, time.Since(t))
			}
			lat[i] = own
			mu.Lock()
			total += int64(len(own))
			mu.Unlock()
		}()
	}
	done.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return Result{}, err
		}
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := Result{Clients: clients, Ops: len(all), Elapsed: elapsed}
	if len(all) > 0 {
		r.P50 = Percentile(all, 50)
		r.P99 = Percentile(all, 99)
		var sum time.Duration
		for _, l := range all {
			sum += l
		}
		r.Mean = sum / time.Duration(len(all))
	}
	return r, nil
}

// Percentile returns the p-th percentile (nearest rank) of sorted.
func Percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (len(sorted)*p + 99) / 100 // ceil(n·p/100)
	return sorted[max(rank, 1)-1]
}

package signin_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/middleware/upload"
)

// clients runs op b.N times in all, spread over exactly n goroutines (n
// concurrent clients, whatever GOMAXPROCS is), and reports ops/s.
func clients(b *testing.B, n int, op func(ctx context.Context, client, i int) error) {
	b.Helper()
	ctx := context.Background()
	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		failed atomic.Pointer[error]
	)
	b.ResetTimer()
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) || failed.Load() != nil {
					return
				}
				if err := op(ctx, c, int(i)); err != nil {
					failed.Store(&err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkLimits measures the statements each limit costs, at 1 and 16
// concurrent clients on a pool of 16 connections, beside two baselines
// measured in the same run: SELECT 1 (db.New().SessionPing, the cheapest
// round trip) (redis_rate, the Redis-based limiter, is compared in make bench: BENCHMARKS.md).
// It is the benchmark of middleware/upload and middleware/inflight too.
//
//   - signin-check: a sign-in's one read (Limiter.Acquire, normal mode) of a
//     key with failures.
//   - signin-record-failure: the failure upsert Permit.Fail runs
//     (LoginAttemptRecordFailure on the pool, its own transaction).
//   - signin-failed-attempt: both, as a failed sign-in costs them (a key
//     takes 1,000 failures, below the limit, then the next key is used).
//   - upload-claim: one upload's slot (permit claim in upload_window: lock +
//     claim in one round trip), a new user each time, in a table that
//     starts empty (rows=0) or with 10,000 live slots of other users.
//   - inflight-claim-release: one request's slot claimed and released (two
//     round trips).
//
// Run: go test -run '^$' -bench Limits ./middleware/signin/
func BenchmarkLimits(b *testing.B) {
	pool, _ := pgtest.NewDB(b, 16)
	q := db.New()
	throttle, err := signin.New(pool, signin.Options{Lenient: true, Limit: pglimit.MaxLimit, Window: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	tokens, err := inflight.New(pool, inflight.Options{Key: func(*http.Request) (string, bool) { return "", false }, Limit: 64})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for c := 0; c < 16; c++ { // every client's key has failures: Check reads a row
		a, err := throttle.Acquire(ctx, fmt.Sprint("bench-check-", c))
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Fail(ctx); err != nil {
			b.Fatal(err)
		}
	}
	var run atomic.Int64 // keeps keys of repeated runs apart
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("select-1/clients=%d", n), func(b *testing.B) {
			clients(b, n, func(ctx context.Context, _, _ int) error { return q.SessionPing(ctx, pool) })
		})
		b.Run(fmt.Sprintf("signin-check/clients=%d", n), func(b *testing.B) {
			clients(b, n, func(ctx context.Context, c, _ int) error {
				_, err := throttle.Acquire(ctx, fmt.Sprint("bench-check-", c))
				return err
			})
		})
		b.Run(fmt.Sprintf("signin-record-failure/clients=%d", n), func(b *testing.B) {
			r := run.Add(1)
			clients(b, n, func(ctx context.Context, c, _ int) error {
				_, err := q.LoginAttemptRecordFailure(ctx, pool, &db.LoginAttemptRecordFailureParams{
					Key: fmt.Sprint("bench-record-", r, "-", c), WindowMs: time.Hour.Milliseconds()})
				return err
			})
		})
		b.Run(fmt.Sprintf("signin-failed-attempt/clients=%d", n), func(b *testing.B) {
			r := run.Add(1)
			clients(b, n, func(ctx context.Context, c, i int) error {
				a, err := throttle.Acquire(ctx, fmt.Sprint("bench-attempt-", r, "-", c, "-", i/1000))
				if err != nil {
					return err
				}
				return a.Fail(ctx)
			})
		})
		for _, rows := range []int{0, 10000} {
			b.Run(fmt.Sprintf("upload-claim/rows=%d/clients=%d", rows, n), func(b *testing.B) {
				// A database of its own, holding rows live slots of other
				// users before the run (and the run's own claims, which are
				// kept: the table grows by b.N).
				upool, _ := pgtest.NewDB(b, 16)
				if _, err := upool.Exec(ctx, `
					INSERT INTO pglimit.upload_window (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
					SELECT 'upload_window', 'upload:other-' || g, 1, gen_random_uuid(), 'other', 'upload', 'r', now(), now() + interval '1 hour'
					FROM generate_series(1, $1) AS g`, rows); err != nil {
					b.Fatal(err)
				}
				uploads, err := upload.New(upool, upload.Options{Key: func(*http.Request) (string, bool) { return "", false }})
				if err != nil {
					b.Fatal(err)
				}
				clients(b, n, func(ctx context.Context, _, i int) error {
					_, err := uploads.Acquire(ctx, fmt.Sprint("bench-user-", i))
					return err
				})
			})
		}
		b.Run(fmt.Sprintf("inflight-claim-release/clients=%d", n), func(b *testing.B) {
			clients(b, n, func(ctx context.Context, c, _ int) error {
				p, err := tokens.Acquire(ctx, fmt.Sprint("bench-token-", c))
				if err != nil {
					return err
				}
				return p.Release(ctx)
			})
		})
	}
}

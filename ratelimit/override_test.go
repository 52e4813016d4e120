package ratelimit_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/override"
	"github.com/pglimit/pglimit/ratelimit"
)

// overriddenReplicas are n replicas (a pool, its bus, its override.Store
// and a limiter of policy "api" reading it, borrowing when borrow) on one
// database, keyed by X-User, their overrides looked up as "user:" + key.
func overriddenReplicas(t *testing.T, n int, policy ratelimit.Policy, borrow bool) ([]*limiter, []*override.Store) {
	t.Helper()
	url := pgtest.URL(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var limiters []*limiter
	var stores []*override.Store
	var pools []*pgxpool.Pool
	for range n {
		pool := pgtest.Pool(t, url, 8)
		pools = append(pools, pool)
		s, err := override.New(context.Background(), pool, override.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- s.Run(runCtx) }()
		t.Cleanup(func() { stop(); <-ran })
		stores = append(stores, s)
		limiters = append(limiters, newLimiter(t, pool, options{
			Key:          func(r *http.Request) (string, bool) { u := r.Header.Get("X-User"); return u, u != "" },
			Policies:     []ratelimit.Policy{policy},
			Overrides:    s,
			QualifiedKey: func(k string) string { return "user:" + k },
			Borrow:       borrow,
			Logger:       quiet,
		}))
	}
	pgtest.Listen(t, pools...)
	return limiters, stores
}

// admitted counts how many of n requests of user, sent by workers
// goroutines over every limiter in turn, are admitted.
func admitted(t *testing.T, ls []*limiter, user string, n, workers int) int {
	t.Helper()
	var got, next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				_, err := ls[(int(i)+w)%len(ls)].Acquire(context.Background(), user)
				switch {
				case err == nil:
					got.Add(1)
				case !errors.Is(err, pglimit.ErrLimited):
					failed.Store(err)
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	return int(got.Load())
}

// TestOverrideAcrossReplicas: a policy of 10 per hour (burst 10) holds
// bob to exactly 10 over three replicas under a parallel burst. Overrides
// of 40 set on one replica are in force on all within a second: dave, who
// spent nothing, gets exactly 40 (the burst scaled 10 → 40); bob, who spent
// his whole burst, keeps that share spent and earns units back at the new
// rate (Retry-After at most 90 s, not 360 s); carol, without an override,
// keeps the policy's 10. An override of 0 refuses bob with no Retry-After
// (limit 0); its removal gives him the policy back.
func TestOverrideAcrossReplicas(t *testing.T) {
	t.Parallel()
	for _, borrow := range []bool{false, true} {
		t.Run(map[bool]string{false: "decided", true: "borrowed"}[borrow], func(t *testing.T) {
			ls, stores := overriddenReplicas(t, 3, ratelimit.Policy{Name: "api", Limit: 10, Window: time.Hour}, borrow)
			ctx := context.Background()
			if got := admitted(t, ls, "bob", 60, 12); got != 10 {
				t.Fatalf("bob without an override: %d of 60 admitted, want 10", got)
			}
			var le *ratelimit.LimitError
			if _, err := ls[0].Acquire(ctx, "bob"); !errors.As(err, &le) || le.Limit != 10 || le.RetryAfter < 300*time.Second {
				t.Fatalf("bob past the policy: %v", err)
			}
			start := time.Now()
			for _, user := range []string{"user:bob", "user:dave"} {
				if _, err := stores[0].Set(ctx, "api", user, 40, 0); err != nil {
					t.Fatal(err)
				}
			}
			waitInForce(t, "the overrides of 40", func() bool {
				for _, s := range stores {
					if n, ok := s.Limit("api", "user:dave"); !ok || n != 40 {
						return false
					}
				}
				return true
			})
			t.Logf("overrides in force on 3 replicas %v after they were set", time.Since(start).Round(time.Millisecond))
			if got := admitted(t, ls, "dave", 200, 12); got != 40 {
				t.Fatalf("dave with an override of 40: %d of 200 admitted, want 40", got)
			}
			if got := admitted(t, ls, "carol", 60, 12); got != 10 {
				t.Fatalf("carol, no override: %d of 60 admitted, want 10", got)
			}
			for i, l := range ls {
				if _, err := l.Acquire(ctx, "bob"); !errors.As(err, &le) || le.Limit != 40 || le.RetryAfter <= 0 || le.RetryAfter > 90*time.Second {
					t.Fatalf("replica %d, bob with an override of 40 after spending the policy's burst: %v (want limit 40, Retry-After within 90s)", i, err)
				}
			}

			if _, err := stores[1].Set(ctx, "api", "user:bob", 0, 0); err != nil {
				t.Fatal(err)
			}
			waitInForce(t, "the override of 0", func() bool {
				for _, s := range stores {
					if n, ok := s.Limit("api", "user:bob"); !ok || n != 0 {
						return false
					}
				}
				return true
			})
			for i, l := range ls {
				_, err := l.Acquire(ctx, "bob")
				if !errors.As(err, &le) || le.Limit != 0 || le.RetryAfter != 0 {
					t.Fatalf("replica %d, override 0: %v (want a refusal of limit 0 without Retry-After)", i, err)
				}
			}
			if removed, err := stores[2].Remove(ctx, "api", "user:bob"); err != nil || !removed {
				t.Fatalf("remove: %v %v", removed, err)
			}
			waitInForce(t, "the removal", func() bool {
				for _, s := range stores {
					if _, ok := s.Limit("api", "user:bob"); ok {
						return false
					}
				}
				return true
			})
			// The policy again: bob spent 40 of an hour's 10, so he is
			// refused with a Retry-After (the GCRA's state is kept).
			for i, l := range ls {
				_, err := l.Acquire(ctx, "bob")
				if !errors.As(err, &le) || le.Limit != 10 || le.RetryAfter <= 0 {
					t.Fatalf("replica %d, override removed: %v (want the policy's refusal)", i, err)
				}
			}
		})
	}
}

// TestOverrideGivesBackBorrowedBatch: a hot key borrows a batch under the
// policy; lowering its override makes the next request give the batch back
// and be judged under the new limit, so the key gets no more than the new
// limit allows from then on.
func TestOverrideGivesBackBorrowedBatch(t *testing.T) {
	t.Parallel()
	ls, stores := overriddenReplicas(t, 2, ratelimit.Policy{Name: "api", Limit: 1000, Window: time.Second, Burst: 50}, true)
	ctx := context.Background()
	// Warm bob up past the hot threshold on replica 0: it borrows.
	for range 30 {
		if _, err := ls[0].Acquire(ctx, "bob"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stores[1].Set(ctx, "api", "user:bob", 1, 0); err != nil {
		t.Fatal(err)
	}
	waitInForce(t, "the override of 1", func() bool { n, ok := stores[0].Limit("api", "user:bob"); return ok && n == 1 })
	// Limit 1 per second, burst scaled 50 → 1: in the next half second
	// bob gets at most 1 + 1 (a unit freed while it ran), over both
	// replicas, whatever replica 0 had borrowed.
	start := time.Now()
	got := 0
	for time.Since(start) < 500*time.Millisecond {
		for _, l := range ls {
			if _, err := l.Acquire(ctx, "bob"); err == nil {
				got++
			}
		}
	}
	if got > 2 {
		t.Fatalf("bob after an override of 1/s: %d admitted in %v, want at most 2", got, time.Since(start))
	}
	t.Logf("bob after an override of 1/s: %d admitted in %v", got, time.Since(start).Round(time.Millisecond))
}

// waitInForce polls cond up to two seconds (the contract's second, and one
// for a loaded machine).
func waitInForce(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not in force on every replica within 2s", what)
		}
	}
}

// TestOverrideHandlerHeaders: the RateLimit headers of an overridden key
// name its own limit and burst.
func TestOverrideHandlerHeaders(t *testing.T) {
	t.Parallel()
	ls, stores := overriddenReplicas(t, 1, ratelimit.Policy{Name: "api", Limit: 10, Window: time.Minute, Burst: 20}, false)
	if _, err := stores[0].Set(context.Background(), "api", "user:dave", 5, 0); err != nil {
		t.Fatal(err)
	}
	h := ls[0].Handler(ok)
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-User", "dave")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK || w.Header().Get("RateLimit-Policy") != `"api";q=5;w=60;pglimit-burst=10` {
		t.Fatalf("%d RateLimit-Policy %q", w.Code, w.Header().Get("RateLimit-Policy"))
	}
	if got := w.Header().Get("RateLimit"); !strings.HasPrefix(got, `"api";r=9;`) {
		t.Fatalf("RateLimit %q, want remaining 9 of a burst scaled 20 → 10", got)
	}
}

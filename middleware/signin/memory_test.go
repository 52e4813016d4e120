package signin_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/signin"
)

// replicas are limiters on pools of one database, with the bus live on
// each, and the meters they count in.
func replicas(t *testing.T, n int, opts signin.Options) (string, []*pgxpool.Pool, []*signin.Limiter, []*observetest.Meter) {
	t.Helper()
	url := pgtest.URL(t)
	pools := make([]*pgxpool.Pool, n)
	ls := make([]*signin.Limiter, n)
	ms := make([]*observetest.Meter, n)
	for i := range n {
		pools[i] = pgtest.Pool(t, url, 4)
	}
	pgtest.Listen(t, pools...)
	for i := range n {
		o := opts
		ms[i] = observetest.New()
		o.MeterProvider = ms[i]
		ls[i] = newLimiter(t, pools[i], o)
	}
	return url, pools, ls, ms
}

func fail(t *testing.T, l *signin.Limiter, key string) {
	t.Helper()
	p, err := l.Acquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Fail(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestThrottledKeyAnsweredFromMemory: a throttled username hammered on two
// replicas costs each replica one statement, by the database's count of
// the scans of login_attempt, in strict and in lenient mode; every attempt
// is refused, and the refusals from memory are counted with source
// "memory".
func TestThrottledKeyAnsweredFromMemory(t *testing.T) {
	t.Parallel()
	for _, lenient := range []bool{false, true} {
		t.Run(map[bool]string{false: "strict", true: "lenient"}[lenient], func(t *testing.T) {
			t.Parallel()
			url, pools, ls, ms := replicas(t, 2, signin.Options{Limit: 3, Window: time.Minute, Lenient: lenient})
			for range 3 {
				fail(t, ls[0], "mallory")
			}
			const workers = 4
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				attempts int
			)
			stop := time.Now().Add(time.Second)
			for i := range len(ls) * workers {
				l := ls[i%len(ls)]
				wg.Go(func() {
					n := 0
					for time.Now().Before(stop) {
						_, err := l.Acquire(context.Background(), "mallory")
						if !errors.Is(err, pglimit.ErrLimited) {
							t.Errorf("a throttled key: %v", err)
							return
						}
						n++
						time.Sleep(200 * time.Microsecond)
					}
					mu.Lock()
					attempts += n
					mu.Unlock()
				})
			}
			wg.Wait()
			act := pgtest.Activity(t, url, "login_attempt", pools...)
			var fromMemory int64
			for _, m := range ms {
				fromMemory += m.Counts(t, "pglimit.decisions", "outcome", "source")["refused memory"]
			}
			t.Logf("%d refused attempts, %d from memory; login_attempt: %d index scans, %d rows written (the 3 failures included)",
				attempts, fromMemory, act.IndexScans, act.Writes)
			// The three failures, then each worker's first attempt
			// (in flight before a refusal was remembered): at most two
			// scans each (the reservation's conflict check and its read).
			if bound := int64(2 * (3 + len(ls)*workers)); act.IndexScans > bound {
				t.Errorf("%d scans of login_attempt for %d refused attempts, want at most %d", act.IndexScans, attempts, bound)
			}
			if fromMemory < int64(attempts-len(ls)*workers) || attempts < 100 {
				t.Errorf("%d of %d attempts refused from memory", fromMemory, attempts)
			}
		})
	}
}

// TestResetLetsInEveryReplica: a username throttled on two replicas (each
// refusing it from memory) is reset by an operator on one; the other lets
// it sign in again long before the throttle would lapse (an hour): within
// a second on a quiet machine (logged); the test allows 10 s, which a
// notification delayed by a loaded machine takes, and a refusal kept until
// it lapses never meets. A success on one replica of an attempt let
// through before the throttle does the same.
func TestResetLetsInEveryReplica(t *testing.T) {
	t.Parallel()
	_, _, ls, _ := replicas(t, 2, signin.Options{Limit: 2, Window: time.Hour})
	ctx := context.Background()
	admitted := func(l *signin.Limiter, key string, start time.Time) {
		t.Helper()
		for {
			p, err := l.Acquire(ctx, key)
			if err == nil {
				_ = p.Release(ctx)
				t.Logf("%s admitted on the other replica %v after", key, time.Since(start).Round(time.Millisecond))
				return
			}
			if !errors.Is(err, pglimit.ErrLimited) {
				t.Fatal(err)
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%s: the other replica still refuses %v after", key, time.Since(start))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	throttled := func(key string) {
		t.Helper()
		for round := 0; round < 2; round++ {
			for i, l := range ls {
				if _, err := l.Acquire(ctx, key); !errors.Is(err, pglimit.ErrLimited) {
					t.Fatalf("replica %d: %v, want the key throttled", i, err)
				}
			}
		}
	}

	// An operator's reset, by the username as typed.
	fail(t, ls[0], "username:eve")
	fail(t, ls[1], "username:eve")
	throttled("username:eve")
	start := time.Now()
	n, err := ls[0].Reset(ctx, "  EVE ")
	if err != nil || n != 2 {
		t.Fatalf("Reset: %d, %v; want the 2 failures cleared", n, err)
	}
	admitted(ls[1], "username:eve", start)

	// A success of an attempt that began before the throttle.
	early, err := ls[0].Acquire(ctx, "username:frank")
	if err != nil {
		t.Fatal(err)
	}
	fail(t, ls[1], "username:frank")
	throttled("username:frank")
	start = time.Now()
	if err := early.Succeed(ctx); err != nil {
		t.Fatal(err)
	}
	admitted(ls[1], "username:frank", start)
}

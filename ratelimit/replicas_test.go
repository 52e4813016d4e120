package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/ratelimit"
)

// via is what the limiters decide with.
type via int

const (
	viaStatements via = iota // the statements of one server
	viaGeneral               // APIRequestWindowDecide alone
	viaShard                 // the functions a Citus cluster runs on a key's shard
)

func (v via) String() string {
	return [...]string{"statements", "general statement", "shard functions"}[v]
}

// hammer runs workers per pool (each pool a replica with a limiter of its
// own) deciding for one key for d, with costs from cost, and returns every
// decision as the workers saw it.
func hammer(t *testing.T, pools []*pgxpool.Pool, workers int, d time.Duration, policies []ratelimit.Policy,
	with via, cost func(*rand.Rand) int) []record {
	t.Helper()
	return hammerWith(t, pools, workers, d, options{Policies: policies}, with, cost)
}

// hammerWith is hammer with the limiters' options (Policies set, the rest
// as the test wants).
func hammerWith(t *testing.T, pools []*pgxpool.Pool, workers int, d time.Duration, opts options,
	with via, cost func(*rand.Rand) int) []record {
	t.Helper()
	limiters := make([]*limiter, len(pools))
	for i, pool := range pools {
		o := opts
		o.Key = func(*http.Request) (string, bool) { return "", false }
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		l, err := build(pool, o)
		if err != nil {
			t.Fatal(err)
		}
		switch with {
		case viaGeneral:
			ratelimit.GeneralOnly(l.Limiter)
		case viaShard:
			ratelimit.OnShard(l.Limiter)
		}
		limiters[i] = l
	}
	var (
		mu   sync.Mutex
		recs []record
		wg   sync.WaitGroup
	)
	stop := time.Now().Add(d)
	for i := range len(pools) * workers {
		l := limiters[i%len(pools)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			var mine []record
			for time.Now().Before(stop) {
				c := cost(rng)
				sent := time.Now()
				p, err := l.AcquireN(context.Background(), "the-key", c, nil)
				received := time.Now()
				r := record{cost: c, sent: micro(sent), received: micro(received)}
				var le *ratelimit.LimitError
				switch {
				case err == nil:
					r.admitted, r.at = true, micro(p.At)
				case errors.As(err, &le):
					r.at, r.retry, r.violated = micro(le.At), le.RetryAfter.Microseconds(), le.Violated
				default:
					t.Error(err)
					return
				}
				mine = append(mine, r)
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			}
			mu.Lock()
			recs = append(recs, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return recs
}

// threePools stands three replicas on one fresh database.
func threePools(t *testing.T) []*pgxpool.Pool {
	t.Helper()
	url := pgtest.URL(t)
	return []*pgxpool.Pool{pgtest.Pool(t, url, 4), pgtest.Pool(t, url, 4), pgtest.Pool(t, url, 4)}
}

func hammerTime() time.Duration {
	if testing.Short() {
		return time.Second
	}
	return 2 * time.Second
}

// TestReplicasHoldTheRate: three replicas deciding for one key at once
// admit, in every interval of length L, at most burst + rate × L requests
// (by the decision times the answers carry), refuse none the model says
// had room, and tell each refused request the exact Retry-After — with the
// one-policy statement, with the general one, and with the function a
// Citus cluster runs on the key's shard.
func TestReplicasHoldTheRate(t *testing.T) {
	t.Parallel()
	policies := []ratelimit.Policy{{Name: "api", Limit: 50, Window: time.Second, Burst: 10}}
	for _, with := range []via{viaStatements, viaGeneral, viaShard} {
		t.Run(with.String(), func(t *testing.T) {
			t.Parallel()
			// Demand outran the rate: the limiter must have admitted close to
			// everything the bound allows over the run, and refused the rest.
			// The run is measured by the decisions' own times (the
			// database's), from the first to the last: the workers' first
			// decisions wait for their pools' connections, which a loaded
			// machine makes slow, so the hammer's duration is not the run. A
			// machine whose workers stall (the race detector beside a CPU
			// hog) leaves moments without demand: it runs again, twice as
			// long, for a fresh key's bound to be reached; the bound must
			// hold on every run.
			reachedRate(t, func(d time.Duration) (bool, string) {
				recs := hammer(t, threePools(t), 4, d, policies, with, func(*rand.Rand) int { return 1 })
				v := judge(policies, recs)
				holds(t, v)
				return len(v.reach) > 0 && float64(v.admitted) >= 0.8*v.reach[0] && v.refusals > 0,
					fmt.Sprintf("admitted %d of a bound over the run of %.1f with %d refusals", v.admitted, v.reach, v.refusals)
			})
		})
	}
}

// reachedRate runs a hammer for hammerTime, and again for twice as long,
// up to three runs, until run says its demand reached the rate; it fails t
// when none did.
func reachedRate(t *testing.T, run func(time.Duration) (reached bool, what string)) {
	t.Helper()
	d := hammerTime()
	for attempt := 1; ; attempt++ {
		reached, what := run(d)
		if reached {
			return
		}
		if attempt == 3 || t.Failed() {
			t.Errorf("%s: the demand did not reach the rate in %d runs", what, attempt)
			return
		}
		t.Logf("%s in a run of %v: the demand did not reach the rate; again for %v", what, d, 2*d)
		d *= 2
	}
}

// TestReplicasAllOrNothing: two policies on every request, binding at
// different times (the burst of "fast" first, then the rate of "slow").
// A refused request must spend neither: had it spent one, later requests
// would be refused with room in the model.
func TestReplicasAllOrNothing(t *testing.T) {
	t.Parallel()
	policies := []ratelimit.Policy{
		{Name: "fast", Limit: 40, Window: time.Second, Burst: 4},
		{Name: "slow", Limit: 15, Window: time.Second, Burst: 12},
	}
	for _, with := range []via{viaStatements, viaShard} {
		t.Run(with.String(), func(t *testing.T) {
			t.Parallel()
			recs := hammer(t, threePools(t), 4, hammerTime(), policies, with, func(*rand.Rand) int { return 1 })
			v := judge(policies, recs)
			holds(t, v)
			byPolicy := map[string]int{}
			for _, r := range recs {
				for _, p := range r.violated {
					byPolicy[p]++
				}
			}
			if byPolicy["fast"] == 0 || byPolicy["slow"] == 0 {
				t.Errorf("refusals by policy %v: both policies must have refused for the test to prove anything", byPolicy)
			}
		})
	}
}

// TestReplicasWeightedCost: requests cost 1 to 4 units; the bound is on
// units, and a refusal must be one the model says had no room for its
// cost.
func TestReplicasWeightedCost(t *testing.T) {
	t.Parallel()
	policies := []ratelimit.Policy{{Name: "units", Limit: 60, Window: time.Second, Burst: 8}}
	for _, with := range []via{viaStatements, viaShard} {
		t.Run(with.String(), func(t *testing.T) {
			t.Parallel()
			recs := hammer(t, threePools(t), 4, hammerTime(), policies, with, func(r *rand.Rand) int { return 1 + r.IntN(4) })
			holds(t, judge(policies, recs))
		})
	}
}

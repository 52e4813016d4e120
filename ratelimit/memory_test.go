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
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/ratelimit"
)

// tableWrites is the observer: the rows inserted and updated in
// pglimit.api_request_window as the database counts them. Every decision
// statement inserts or updates the key's row, refused or not, and so does
// every give-back of borrowed units: this is the number of statements that
// reached the key's table.
func tableWrites(t *testing.T, url string, pools ...*pgxpool.Pool) int64 {
	t.Helper()
	return pgtest.Activity(t, url, "api_request_window", pools...).Writes
}

// pace runs workers on each limiter, each deciding for key then sleeping
// between about pause and twice it, until d has passed; it returns every
// decision.
func pace(t *testing.T, limiters []*limiter, workers int, d, pause time.Duration, key string) []record {
	t.Helper()
	var (
		mu   sync.Mutex
		recs []record
		wg   sync.WaitGroup
	)
	stop := time.Now().Add(d)
	for i := range len(limiters) * workers {
		l := limiters[i%len(limiters)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			var mine []record
			for time.Now().Before(stop) {
				// (No send and answer times: a decision from memory is
				// reported at the database's time from above, which may be
				// after the request was answered by as long as the way
				// out of the statement it remembers.)
				p, err := l.Acquire(context.Background(), key)
				r := record{cost: 1}
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
				time.Sleep(pause + time.Duration(rng.Int64N(int64(pause)+1)))
			}
			mu.Lock()
			recs = append(recs, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return recs
}

func limitersOn(t *testing.T, pools []*pgxpool.Pool, opts options) ([]*limiter, []*observetest.Meter) {
	t.Helper()
	ls := make([]*limiter, len(pools))
	ms := make([]*observetest.Meter, len(pools))
	for i, pool := range pools {
		o := opts
		ms[i] = observetest.New()
		o.MeterProvider = ms[i]
		o.Key = func(*http.Request) (string, bool) { return "", false }
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		l, err := build(pool, o)
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	return ls, ms
}

func count(recs []record) (admitted, refused int) {
	for _, r := range recs {
		if r.admitted {
			admitted++
		} else {
			refused++
		}
	}
	return
}

// TestRefusalsAnsweredFromMemory: one key hammered far past its rate
// from two replicas. With the bus live, a refused key costs each replica
// at most two statements per refusal period (the time until the next unit,
// T) besides the admitted ones, by the database's own count of the writes
// to the key's table; the decisions hold the model exactly (a remembered
// refusal is as exact as the database's); and the refusals answered from
// memory are counted with source "memory". Without the bus every request
// is a statement, which is what the observer sees then.
func TestRefusalsAnsweredFromMemory(t *testing.T) {
	t.Parallel()
	policies := []ratelimit.Policy{{Name: "api", Limit: 5, Window: time.Second, Burst: 5}}
	const period = 200 * time.Millisecond // T
	d := 3 * time.Second
	for _, listen := range []bool{true, false} {
		t.Run(map[bool]string{true: "bus live", false: "no bus"}[listen], func(t *testing.T) {
			t.Parallel()
			url := pgtest.URL(t)
			pools := []*pgxpool.Pool{pgtest.Pool(t, url, 4), pgtest.Pool(t, url, 4)}
			if listen {
				pgtest.Listen(t, pools...)
			}
			ls, ms := limitersOn(t, pools, options{Policies: policies})
			run := d
			if !listen {
				run = time.Second
			}
			recs := pace(t, ls, 4, run, 200*time.Microsecond, "the-key")
			admitted, refused := count(recs)
			writes := tableWrites(t, url, pools...)
			v := judge(policies, recs)
			holds(t, v)
			var fromMemory int64
			for _, m := range ms {
				fromMemory += m.Counts(t, "pglimit.decisions", "outcome", "source")["refused memory"]
			}
			t.Logf("%d requests: %d admitted, %d refused (%d from memory); %d statements reached the table",
				len(recs), admitted, refused, fromMemory, writes)
			if !listen {
				if writes < int64(len(recs)) || writes > int64(len(recs))+int64(len(recs))/100 || fromMemory != 0 {
					t.Errorf("without the bus: %d statements for %d requests, %d from memory: want one statement per request", writes, len(recs), fromMemory)
				}
				return
			}
			// The workers' first requests are in flight together before
			// any refusal is remembered: one each. A remembered refusal is
			// judged by the database's clock from above, so it lets go up
			// to a round trip before the unit is free: the replica's next
			// statement may be refused once more at the boundary, two per
			// replica per refusal period at most.
			bound := int64(admitted) + 2*int64(len(pools))*(int64(d/period)+1) + int64(len(pools)*4)
			if writes > bound {
				t.Errorf("%d statements reached the table, more than the %d admitted + two per replica per refusal period + the first requests (bound %d)", writes, admitted, bound)
			}
			if refused < 10*int(bound) || fromMemory < int64(refused)-bound {
				t.Errorf("%d refusals, %d from memory: the hammer did not go far past the rate, or memory did not answer", refused, fromMemory)
			}
		})
	}
}

// TestResetClearsEveryReplica: a key refused on both replicas (each
// answers it from memory) is reset on one, and the other admits it again
// long before the refusal would lapse (an hour): within a second on a quiet
// machine (logged); the test allows 10 s, which a notification delayed by a
// loaded machine takes, and a refusal kept until it lapses never meets. A
// refusal remembered while the bus was down is not used after it comes back.
func TestResetClearsEveryReplica(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pools := []*pgxpool.Pool{pgtest.Pool(t, url, 2), pgtest.Pool(t, url, 2)}
	pgtest.Listen(t, pools...)
	ls, ms := limitersOn(t, pools, options{Policies: []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour}}})
	ctx := context.Background()
	if _, err := ls[0].Acquire(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 3; round++ {
		for i, l := range ls {
			if _, err := l.Acquire(ctx, "k"); !errors.Is(err, pglimit.ErrLimited) {
				t.Fatalf("replica %d, round %d: %v, want a refusal", i, round, err)
			}
		}
	}
	for i, m := range ms {
		if n := m.Counts(t, "pglimit.decisions", "outcome", "source")["refused memory"]; n != 2 {
			t.Fatalf("replica %d answered %d refusals from memory, want 2 (the first of each was the database's)", i, n)
		}
	}
	start := time.Now()
	if err := ls[0].Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := ls[1].Acquire(ctx, "k")
		if err == nil {
			break
		}
		if !errors.Is(err, pglimit.ErrLimited) {
			t.Fatal(err)
		}
		if time.Since(start) > propagation {
			t.Fatalf("the other replica still refuses the key %v after the reset", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("admitted on the other replica %v after the reset", time.Since(start))
}

// TestMemoryDecidesCheaperAndOtherPolicies: a remembered refusal answers
// requests of its cost or more under its policies; a cheaper request, or
// one under other policies (a changed plan), is decided in the database.
func TestMemoryDecidesCheaperAndOtherPolicies(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	pgtest.Listen(t, pool)
	ls, ms := limitersOn(t, []*pgxpool.Pool{pool}, options{Policies: []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour, Burst: 4}}})
	l, ctx := ls[0], context.Background()
	if _, err := l.AcquireN(ctx, "k", 3, nil); err != nil {
		t.Fatal(err)
	}
	fromMemory := func() int64 { return ms[0].Counts(t, "pglimit.decisions", "outcome", "source")["refused memory"] }
	for range 2 {
		if _, err := l.AcquireN(ctx, "k", 2, nil); !errors.Is(err, pglimit.ErrLimited) {
			t.Fatalf("cost 2 with 1 unit left: %v, want a refusal", err)
		}
	}
	if got := fromMemory(); got != 1 {
		t.Fatalf("%d refusals from memory, want 1", got)
	}
	if _, err := l.AcquireN(ctx, "k", 3, nil); !errors.Is(err, pglimit.ErrLimited) || fromMemory() != 2 {
		t.Fatalf("cost 3 after a refusal of cost 2: %v, %d from memory; want a refusal from memory", err, fromMemory())
	}
	if _, err := l.AcquireN(ctx, "k", 1, nil); err != nil {
		t.Fatalf("cost 1 with 1 unit left: %v, want it admitted by the database", err)
	}
	other := []ratelimit.Policy{{Name: "plan-b", Limit: 100, Window: time.Second, Burst: 100}}
	if _, err := l.AcquireN(ctx, "k", 2, other); err != nil {
		t.Fatalf("under another policy: %v, want the database's decision (admitted)", err)
	}
}

// TestBorrowingHoldsTheModel: three replicas borrowing for one hot key
// admit, in every interval of length L, at most burst + rate × L units by
// the decision times the permits carry, and the demand reaches the rate.
// Refusals that had room are the price of borrowing and are not judged.
func TestBorrowingHoldsTheModel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		policies []ratelimit.Policy
		cost     func(*rand.Rand) int
	}{
		{"one unit", []ratelimit.Policy{{Name: "api", Limit: 50, Window: time.Second, Burst: 10}}, func(*rand.Rand) int { return 1 }},
		{"large burst", []ratelimit.Policy{{Name: "api", Limit: 200, Window: time.Second, Burst: 400}}, func(*rand.Rand) int { return 1 }},
		{"weighted", []ratelimit.Policy{{Name: "api", Limit: 60, Window: time.Second, Burst: 8}}, func(r *rand.Rand) int { return 1 + r.IntN(4) }},
	} {
		for _, with := range []via{viaStatements, viaShard} {
			if with == viaShard && tc.name != "large burst" {
				continue // the borrowing function, once
			}
			t.Run(tc.name+"/"+with.String(), func(t *testing.T) {
				t.Parallel()
				reachedRate(t, func(d time.Duration) (bool, string) {
					pools := threePools(t)
					pgtest.Listen(t, pools...)
					recs := hammerWith(t, pools, 4, d, options{Policies: tc.policies, Borrow: true}, with, tc.cost)
					v := judge(tc.policies, recs)
					t.Log(v)
					if v.worst > 1 {
						t.Errorf("borrowing broke the bound: %v", v)
					}
					return len(v.reach) > 0 && float64(v.admitted) >= 0.6*v.reach[0],
						fmt.Sprintf("admitted %d units of a bound over the run of %.1f", v.admitted, v.reach)
				})
			})
		}
	}
}

// TestBorrowingCostsFewStatements: a hot key at steady load below its
// rate (two replicas, 300 requests a second each, under 1,000 a second,
// burst 3,000) costs at most 20 statements on its table per 1,000
// decisions, by the database's count; everything is admitted.
func TestBorrowingCostsFewStatements(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pools := []*pgxpool.Pool{pgtest.Pool(t, url, 4), pgtest.Pool(t, url, 4)}
	pgtest.Listen(t, pools...)
	ls, ms := limitersOn(t, pools, options{Borrow: true,
		Policies: []ratelimit.Policy{{Name: "api", Limit: 1000, Window: time.Second, Burst: 3000}}})
	recs := steady(t, ls, 300, 5*time.Second, "hot")
	for _, l := range ls {
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	admitted, refused := count(recs)
	writes := tableWrites(t, url, pools...)
	var borrowed, spent, returned, stranded int64
	for _, m := range ms {
		borrowed += m.Counts(t, "pglimit.ratelimit.borrowed")[""]
		spent += m.Counts(t, "pglimit.ratelimit.spent")[""]
		returned += m.Counts(t, "pglimit.ratelimit.returned")[""]
		stranded += m.Counts(t, "pglimit.ratelimit.stranded")[""]
	}
	perK := float64(writes) * 1000 / float64(len(recs))
	bySource := map[string]int64{}
	for _, m := range ms {
		for k, v := range m.Counts(t, "pglimit.decisions", "outcome", "source") {
			bySource[k] += v
		}
	}
	t.Logf("%d decisions (%d admitted, %d refused; by outcome and source %v): %d statements, %.1f per 1,000; units borrowed %d, spent %d, returned %d, stranded %d",
		len(recs), admitted, refused, bySource, writes, perK, borrowed, spent, returned, stranded)
	if refused > 0 {
		t.Errorf("%d refusals below the rate", refused)
	}
	if perK > 20 {
		t.Errorf("%.1f statements per 1,000 decisions of a hot key, want at most 20", perK)
	}
	if borrowed == 0 || spent == 0 || borrowed != spent+returned+stranded {
		t.Errorf("units: borrowed %d != spent %d + returned %d + stranded %d", borrowed, spent, returned, stranded)
	}
}

// steady sends perSecond decisions of key a second on each limiter, evenly
// spaced, for d (each limiter a ticker of its own), and returns them.
func steady(t *testing.T, ls []*limiter, perSecond int, d time.Duration, key string) []record {
	t.Helper()
	var (
		mu   sync.Mutex
		recs []record
		wg   sync.WaitGroup
		fail atomic.Bool
	)
	for _, l := range ls {
		wg.Go(func() {
			tick := time.NewTicker(time.Second / time.Duration(perSecond))
			defer tick.Stop()
			stop := time.After(d)
			var inner sync.WaitGroup
			for {
				select {
				case <-stop:
					inner.Wait()
					return
				case <-tick.C:
				}
				inner.Go(func() {
					p, err := l.Acquire(context.Background(), key)
					r := record{cost: 1}
					switch {
					case err == nil:
						r.admitted, r.at = true, micro(p.At)
					case errors.Is(err, pglimit.ErrLimited):
					default:
						if fail.CompareAndSwap(false, true) {
							t.Error(err)
						}
						return
					}
					mu.Lock()
					recs = append(recs, r)
					mu.Unlock()
				})
			}
		})
	}
	wg.Wait()
	return recs
}

// TestBorrowingAboveTheLimit: three replicas each far above a key's rate
// for 10 s admit at least 90 % of the bound over the run (burst + rate ×
// the run), and never more.
func TestBorrowingAboveTheLimit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("10 s of load")
	}
	policies := []ratelimit.Policy{{Name: "api", Limit: 100, Window: time.Second, Burst: 100}}
	pools := threePools(t)
	pgtest.Listen(t, pools...)
	ls, _ := limitersOn(t, pools, options{Policies: policies, Borrow: true})
	recs := pace(t, ls, 4, 10*time.Second, time.Millisecond, "over")
	v := judge(policies, recs)
	t.Log(v)
	if v.worst > 1 {
		t.Errorf("borrowing broke the bound: %v", v)
	}
	if len(v.reach) == 0 || float64(v.admitted) < 0.9*v.reach[0] {
		t.Errorf("admitted %d of a bound over the run of %v: want at least 90 %%", v.admitted, v.reach)
	}
}

// propagation bounds how long a test waits for every replica to hear of a
// reset (a notification on the bus): about a second on a quiet machine, and
// several on a loaded one; far below the windows of the refusals it clears
// (an hour), so a replica that kept its refusal still fails the test.
const propagation = 10 * time.Second

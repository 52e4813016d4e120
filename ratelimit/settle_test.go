package ratelimit_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/ratelimit"
)

// remaining is what key may spend now under l's policies, read without
// spending (a decision of cost 0).
func remaining(t *testing.T, l *limiter, key string) []int {
	t.Helper()
	p, err := l.AcquireN(context.Background(), key, 0, nil)
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	out := make([]int, len(p.Policies))
	for i, s := range p.Policies {
		out[i] = s.Remaining
	}
	return out
}

// TestSettle: a permit admitted at an estimate settles its actual cost:
// a further charge moves the key's state on whatever the room, a refund
// gives units back while nothing was spent after it and lets them lapse
// otherwise, and a borrowed permit never refunds.
func TestSettle(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	ctx := context.Background()
	hour := ratelimit.Policy{Name: "hour", Limit: 10, Window: time.Hour}
	l := newLimiter(t, pool, options{Name: "settle", Policies: []ratelimit.Policy{hour}})
	acquire := func(key string, cost int) *ratelimit.Permit {
		t.Helper()
		p, err := l.AcquireN(ctx, key, cost, nil)
		if err != nil {
			t.Fatalf("%s: AcquireN(%d): %v", key, cost, err)
		}
		return p
	}
	settle := func(p *ratelimit.Permit, actual int) {
		t.Helper()
		if err := p.Settle(ctx, actual); err != nil {
			t.Fatalf("Settle(%d): %v", actual, err)
		}
		if p.Cost != actual {
			t.Errorf("after Settle(%d) the permit's Cost is %d", actual, p.Cost)
		}
	}
	check := func(key string, want int) {
		t.Helper()
		if got := remaining(t, l, key); got[0] != want {
			t.Errorf("%s: %d remaining, want %d", key, got[0], want)
		}
	}

	p := acquire("more", 2)
	settle(p, 5)
	check("more", 5)
	if p.Policies[0].Remaining != 5 {
		t.Errorf("the settled permit's state says %d remaining, want 5", p.Policies[0].Remaining)
	}

	settle(acquire("less", 4), 1)
	check("less", 9)

	// Another decision spent after it: the refund's units lapse instead.
	first := acquire("late", 4)
	acquire("late", 1)
	settle(first, 1)
	check("late", 5)

	// Past the burst: the work is done, the key is refused for longer.
	settle(acquire("over", 10), 13)
	_, err := l.AcquireN(ctx, "over", 1, nil)
	var le *ratelimit.LimitError
	// The TAT is 78 min ahead: a unit (6 min) fits when it is 54 min ahead.
	if !errors.As(err, &le) || le.RetryAfter < 23*time.Minute+59*time.Second || le.RetryAfter > 24*time.Minute {
		t.Errorf("after a settle 3 units past the burst of a 10/h policy: %v; want a refusal for 24 min", err)
	}

	// A ctx that ended does not stop the settle.
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := acquire("canceled", 1).Settle(canceled, 3); err != nil {
		t.Errorf("a settle after its ctx ended: %v", err)
	}
	check("canceled", 7)

	// Two policies move together.
	two := newLimiter(t, pool, options{Name: "settle-two", Policies: []ratelimit.Policy{hour, {Name: "day", Limit: 100, Window: 24 * time.Hour}}})
	p2, err := two.AcquireN(ctx, "k", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Settle(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, two, "k"); !slices.Equal(got, []int{6, 96}) {
		t.Errorf("two policies after a settle of 4: %v remaining, want [6 96]", got)
	}
}

// TestSettleBadInput: what a settle cannot do is an error, never a panic
// nor a change of the key's state.
func TestSettleBadInput(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	ctx := context.Background()
	l := newLimiter(t, pool, options{Name: "settle-bad", Policies: []ratelimit.Policy{{Name: "year", Limit: 1, Window: 366 * 24 * time.Hour, Burst: 1000}}})
	for _, tc := range []struct {
		name   string
		actual int
		want   error
	}{
		{"negative", -1, pglimit.ErrInvalidCost},
		{"most negative", math.MinInt, pglimit.ErrInvalidCost},
		{"absurd", math.MaxInt, pglimit.ErrInvalidCost},
		{"a unit a year for ever", math.MaxInt64 / (366 * 24 * 3600), pglimit.ErrInvalidCost},
	} {
		p, err := l.AcquireN(ctx, tc.name, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Settle(ctx, tc.actual); !errors.Is(err, tc.want) {
			t.Errorf("%s: Settle(%d) = %v, want %v", tc.name, tc.actual, err, tc.want)
		}
		if got := remaining(t, l, tc.name); got[0] != 999 {
			t.Errorf("%s: %d remaining after a refused settle, want 999", tc.name, got[0])
		}
		if err := p.Settle(ctx, 1); err != nil {
			t.Errorf("%s: a good settle after a refused one: %v", tc.name, err)
		}
	}
	p, err := l.AcquireN(ctx, "twice", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Settle(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := p.Settle(ctx, 2); !errors.Is(err, pglimit.ErrSettled) {
		t.Errorf("a second Settle: %v, want ErrSettled", err)
	}
	if got := remaining(t, l, "twice"); got[0] != 998 {
		t.Errorf("after a settle of 2 and a second one refused: %d remaining, want 998", got[0])
	}

	// A dry-run refusal spent nothing and settles nothing.
	dry := newLimiter(t, pool, options{Name: "settle-dry", DryRun: true, Policies: []ratelimit.Policy{{Name: "hour", Limit: 1, Window: time.Hour}}})
	if _, err := dry.AcquireN(ctx, "k", 1, nil); err != nil {
		t.Fatal(err)
	}
	p, err = dry.AcquireN(ctx, "k", 1, nil)
	if err != nil || p.Refusal() == nil {
		t.Fatalf("dry run past the limit: %v, refusal %v", err, p.Refusal())
	}
	if err := p.Settle(ctx, 5); err != nil {
		t.Errorf("a dry-run refusal's settle: %v", err)
	}
}

// TestSettleBorrowedNeverRefunds: a permit spent from a borrowed batch
// settles a further charge in the database, and its refund lapses: the
// key's TAT (read by an observer) never moves back.
func TestSettleBorrowedNeverRefunds(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	ctx := context.Background()
	m := observetest.New()
	l := newLimiter(t, pool, options{Name: "settle-borrow", Borrow: true, MeterProvider: m,
		Policies: []ratelimit.Policy{{Name: "fast", Limit: 1000, Window: time.Second}}})
	tat := func() time.Time {
		t.Helper()
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT tats[1] FROM pglimit.api_request_window WHERE name = 'settle-borrow' AND key = 'hot'`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	// Hot enough to borrow (ten decisions a second and more): keep the
	// permits spent from memory, which the metrics tell.
	fromMemory := func() int64 { return m.Counts(t, "pglimit.decisions", "outcome", "source")["granted memory"] }
	var permits []*ratelimit.Permit
	for i := 0; len(permits) < 2; i++ {
		if i == 2000 {
			t.Fatalf("2,000 decisions a millisecond apart and %d spent from a borrowed batch", len(permits))
		}
		n := fromMemory()
		p, err := l.Acquire(ctx, "hot")
		if err != nil {
			t.Fatal(err)
		}
		if fromMemory() > n {
			permits = append(permits, p)
		}
		time.Sleep(time.Millisecond)
	}
	// An idle batch is given back after 250 ms, which moves the TAT back
	// too: the refund is judged only when none was given back meanwhile.
	returned := func() int64 { return m.Counts(t, "pglimit.ratelimit.returned")[""] }
	gaveBack, before := returned(), tat()
	if err := permits[1].Settle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if after := tat(); after.Before(before) && returned() == gaveBack {
		t.Errorf("a borrowed permit's refund moved the TAT back from %v to %v", before, after)
	}
	before = tat()
	if err := permits[0].Settle(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if after := tat(); after.Sub(before) < 4*time.Millisecond {
		t.Errorf("a borrowed permit's further charge of 4 units (1 ms each) moved the TAT by %v", after.Sub(before))
	}
}

// TestSettleBound: replicas (several pools) admit requests at an estimate
// of 1 and settle each at 3. In every interval of the run, by the
// admissions' database times, the actual units admitted stay within the
// policy's bound plus what the permits unsettled at once may settle above
// their estimates (workers × 2), as the package documents; and the load
// reached the limit (refusals).
func TestSettleBound(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	policy := ratelimit.Policy{Name: "settled", Limit: 20, Window: time.Second, Burst: 5}
	const replicas, workersEach, estimate, actual = 3, 2, 1, 3
	var limiters []*limiter
	for range replicas {
		limiters = append(limiters, newLimiter(t, pgtest.Pool(t, url, 4), options{Name: "settle-bound", Policies: []ratelimit.Policy{policy}}))
	}
	type admission struct {
		at    time.Time
		units int
	}
	var (
		mu       sync.Mutex
		admitted []admission
		refused  int
	)
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for _, l := range limiters {
		for range workersEach {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					p, err := l.AcquireN(ctx, "tenant", estimate, nil)
					var le *ratelimit.LimitError
					switch {
					case errors.As(err, &le):
						mu.Lock()
						refused++
						mu.Unlock()
						time.Sleep(5 * time.Millisecond)
						continue
					case err != nil:
						t.Error(err)
						return
					}
					time.Sleep(2 * time.Millisecond) // the work
					if err := p.Settle(ctx, actual); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					admitted = append(admitted, admission{p.At, actual})
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if len(admitted) == 0 || refused == 0 {
		t.Fatalf("%d admitted, %d refused: the load did not reach the limit", len(admitted), refused)
	}
	slices.SortFunc(admitted, func(a, b admission) int { return a.at.Compare(b.at) })
	unit := policy.Window.Seconds() / float64(policy.Limit)
	overshoot := float64(replicas * workersEach * (actual - estimate))
	worst, total := 0.0, 0
	for i := range admitted {
		units := 0
		for j := i; j < len(admitted); j++ {
			units += admitted[j].units
			bound := float64(policy.Burst) + admitted[j].at.Sub(admitted[i].at).Seconds()/unit + overshoot
			worst = max(worst, float64(units)/bound)
			if float64(units) > bound+1e-9 {
				t.Fatalf("%d units admitted in %v (admissions %d..%d), above the bound %.1f (burst %d + rate × interval + %v unsettled overshoot)",
					units, admitted[j].at.Sub(admitted[i].at), i, j, bound, policy.Burst, overshoot)
			}
		}
		total += admitted[i].units
	}
	t.Logf("%d requests admitted (%d actual units), %d refused; worst interval at %.2f of its bound", len(admitted), total, refused, worst)
}

package quota

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/migrate"
	"github.com/pglimit/pglimit/internal/vocab"
	"github.com/pglimit/pglimit/override"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

func newLimiter(t *testing.T, pool *pgxpool.Pool, o Options) *Limiter {
	t.Helper()
	if o.Name == "" {
		o.Name = "api"
	}
	if o.Period == 0 {
		o.Period = Month
	}
	l, err := New(pool, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// at returns l with its clock set to ts (the database's clock stands in
// otherwise).
func at(l *Limiter, ts time.Time) *Limiter {
	c := *l
	c.at = &ts
	return &c
}

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func TestNewRefusesBadOptions(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.URL(t), 2)
	cases := []struct {
		name string
		o    Options
		nil_ bool
	}{
		{"nil pool", Options{Name: "q", Limit: 1, Period: Day}, true},
		{"no name", Options{Limit: 1, Period: Day}, false},
		{"blank name", Options{Name: "  ", Limit: 1, Period: Day}, false},
		{"long name", Options{Name: strings.Repeat("n", 201), Limit: 1, Period: Day}, false},
		{"zero limit", Options{Name: "q", Period: Day}, false},
		{"negative limit", Options{Name: "q", Limit: -1, Period: Day}, false},
		{"limit above MaxLimit", Options{Name: "q", Limit: MaxLimit + 1, Period: Day}, false},
		{"no period", Options{Name: "q", Limit: 1}, false},
		{"unknown period", Options{Name: "q", Limit: 1, Period: Year + 1}, false},
		{"local zone", Options{Name: "q", Limit: 1, Period: Day, Location: time.Local}, false},
		{"made-up zone", Options{Name: "q", Limit: 1, Period: Day, Location: time.FixedZone("", 3600)}, false},
		{"negative timeout", Options{Name: "q", Limit: 1, Period: Day, Timeout: -time.Second}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p *pgxpool.Pool
			if !c.nil_ {
				p = pool
			}
			l, err := New(p, c.o)
			if err == nil || !strings.HasPrefix(err.Error(), "quota: ") || l != nil {
				t.Fatalf("New(%+v) = %v, %v; want a quota: error", c.o, l, err)
			}
		})
	}
	if _, err := New(pool, Options{Name: "q", Limit: MaxLimit, Period: Year, Location: mustZone(t, "Pacific/Chatham")}); err != nil {
		t.Fatalf("the largest limit in a zone of 45-minute offset: %v", err)
	}
}

// TestCalendarPeriods charges at chosen instants (standing in for the
// database clock) and checks the period PostgreSQL computed in the zone:
// months of 28, 29, 30 and 31 days, the days of a daylight-saving change,
// the year, and that a new period starts from nothing.
func TestCalendarPeriods(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.URL(t), 2)
	ctx := context.Background()
	paris, auckland := mustZone(t, "Europe/Paris"), mustZone(t, "Pacific/Auckland")
	cases := []struct {
		name       string
		period     Period
		loc        *time.Location
		at         time.Time
		start, end time.Time
	}{
		{"February of a common year", Month, time.UTC, time.Date(2027, 2, 14, 12, 0, 0, 0, time.UTC),
			time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)},
		{"February of a leap year", Month, time.UTC, time.Date(2028, 2, 29, 23, 59, 59, 0, time.UTC),
			time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC)},
		{"a 30-day month", Month, paris, time.Date(2026, 4, 30, 21, 59, 0, 0, time.UTC), // 23:59 in Paris
			time.Date(2026, 4, 1, 0, 0, 0, 0, paris), time.Date(2026, 5, 1, 0, 0, 0, 0, paris)},
		{"a 31-day month, its last local hour", Month, paris, time.Date(2026, 12, 31, 23, 30, 0, 0, paris),
			time.Date(2026, 12, 1, 0, 0, 0, 0, paris), time.Date(2027, 1, 1, 0, 0, 0, 0, paris)},
		{"the next month in Paris while UTC is still in the last", Month, paris, time.Date(2026, 10, 31, 23, 30, 0, 0, time.UTC),
			time.Date(2026, 11, 1, 0, 0, 0, 0, paris), time.Date(2026, 12, 1, 0, 0, 0, 0, paris)},
		{"spring forward: a 23-hour day", Day, paris, time.Date(2026, 3, 29, 12, 0, 0, 0, paris),
			time.Date(2026, 3, 29, 0, 0, 0, 0, paris), time.Date(2026, 3, 30, 0, 0, 0, 0, paris)},
		{"fall back: a 25-hour day", Day, paris, time.Date(2026, 10, 25, 2, 30, 0, 0, time.UTC),
			time.Date(2026, 10, 25, 0, 0, 0, 0, paris), time.Date(2026, 10, 26, 0, 0, 0, 0, paris)},
		{"southern summer time", Day, auckland, time.Date(2026, 9, 27, 5, 0, 0, 0, auckland),
			time.Date(2026, 9, 27, 0, 0, 0, 0, auckland), time.Date(2026, 9, 28, 0, 0, 0, 0, auckland)},
		{"the year", Year, paris, time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC),
			time.Date(2026, 1, 1, 0, 0, 0, 0, paris), time.Date(2027, 1, 1, 0, 0, 0, 0, paris)},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := at(newLimiter(t, pool, Options{Name: fmt.Sprintf("cal%d", i), Limit: 10, Period: c.period, Location: c.loc}), c.at)
			p, err := l.AcquireN(ctx, "k", 4)
			if err != nil {
				t.Fatal(err)
			}
			if !p.PeriodStart.Equal(c.start) || !p.Reset.Equal(c.end) {
				t.Fatalf("period [%s, %s), want [%s, %s)", p.PeriodStart.In(c.loc), p.Reset.In(c.loc), c.start, c.end)
			}
			if p.Used != 4 || p.Remaining != 6 {
				t.Fatalf("used %d remaining %d, want 4 and 6", p.Used, p.Remaining)
			}
			_, err = l.AcquireN(ctx, "k", 7)
			var le *LimitError
			if !errors.As(err, &le) || !errors.Is(err, vocab.ErrLimited) {
				t.Fatalf("7 more of 10 with 4 used: %v, want a LimitError", err)
			}
			if want := c.end.Sub(c.at); le.RetryAfter != want {
				t.Fatalf("RetryAfter %s, want %s (to the period's end)", le.RetryAfter, want)
			}
			// The first instant of the next period starts from nothing.
			next, err := at(l, c.end).AcquireN(ctx, "k", 10)
			if err != nil {
				t.Fatalf("the whole limit at the next period's start: %v", err)
			}
			if !next.PeriodStart.Equal(c.end) || next.Used != 10 {
				t.Fatalf("next period starts %s with %d used, want %s with 10", next.PeriodStart, next.Used, c.end)
			}
			// A decision stamped in the previous period but locked after the
			// new one began is counted in the new one.
			if _, err := at(l, c.end.Add(-time.Millisecond)).Acquire(ctx, "k"); err == nil {
				t.Fatal("a late decision of the old period spent the new period's exhausted quota")
			}
		})
	}
}

func TestChargesHoldAcrossReplicas(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	const replicas, workers, limit = 3, 8, 100
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	limiters := make([]*Limiter, replicas)
	for i := range limiters {
		limiters[i] = newLimiter(t, pgtest.Pool(t, url, workers), Options{Limit: limit})
	}
	errs := make(chan error, replicas*workers)
	for i := range replicas * workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := limiters[i%replicas]
			for range 15 {
				_, err := l.Acquire(ctx, "tenant:acme")
				var le *LimitError
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.As(err, &le):
					refused.Add(1)
					if le.RetryAfter <= 0 || le.State.Used < limit {
						errs <- fmt.Errorf("refused with %d used, retry after %s", le.State.Used, le.RetryAfter)
					}
				default:
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The observer: the table itself.
	var used int64
	if err := limiters[0].pool.QueryRow(ctx, `SELECT used FROM pglimit.quota_usage WHERE name = 'api' AND key = 'tenant:acme'`).Scan(&used); err != nil {
		t.Fatal(err)
	}
	if admitted.Load() != limit || used != limit || refused.Load() != replicas*workers*15-limit {
		t.Fatalf("admitted %d, refused %d, the row says %d used; want exactly %d admitted", admitted.Load(), refused.Load(), used, limit)
	}
	// Another key was never touched by this one's exhaustion.
	if _, err := limiters[1].Acquire(ctx, "tenant:other"); err != nil {
		t.Fatalf("another key: %v", err)
	}
}

// TestSettleBound: permits charged an estimate and settled for more, from
// several pools at once. Every unit settled is charged (the row's use is
// the sum of what the admitted work cost), and the use passes the limit by
// at most what the permits unsettled at an admission could add: here each
// settles 2 above its estimate, and at most workers of them are unsettled.
func TestSettleBound(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	const replicas, workers, limit, estimate, actual = 3, 4, 60, 1, 3
	var charged atomic.Int64
	limiters := make([]*Limiter, replicas)
	for i := range limiters {
		limiters[i] = newLimiter(t, pgtest.Pool(t, url, workers), Options{Name: "rows", Limit: limit, Period: Day})
	}
	var wg sync.WaitGroup
	for i := range replicas * workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := limiters[i%replicas]
			for range 40 {
				p, err := l.AcquireN(ctx, "u", estimate)
				if err != nil {
					if !errors.Is(err, vocab.ErrLimited) {
						t.Error(err)
					}
					continue
				}
				time.Sleep(time.Millisecond)
				if err := p.Settle(ctx, actual); err != nil {
					t.Error(err)
					continue
				}
				charged.Add(actual)
			}
		}()
	}
	wg.Wait()
	st, err := limiters[0].Peek(ctx, "u")
	if err != nil {
		t.Fatal(err)
	}
	bound := int64(limit + replicas*workers*(actual-estimate))
	t.Logf("charged %d by the work, the row says %d, limit %d, bound %d", charged.Load(), st.Used, limit, bound)
	if st.Used != charged.Load() {
		t.Fatalf("the row says %d used, the admitted work cost %d", st.Used, charged.Load())
	}
	if st.Used > bound || st.Used < limit {
		t.Fatalf("use %d outside [%d, %d]", st.Used, limit, bound)
	}
	if _, err := limiters[1].Acquire(ctx, "u"); !errors.Is(err, vocab.ErrLimited) {
		t.Fatalf("a key past its limit was admitted: %v", err)
	}
}

func TestSettleRefundsAndBadInput(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.URL(t), 2)
	l := newLimiter(t, pool, Options{Name: "export-rows", Limit: 100, Period: Day})
	ctx := context.Background()
	p, err := l.AcquireN(ctx, "bob", 80)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Settle(ctx, 5); err != nil || p.Used != 5 || p.Cost != 5 {
		t.Fatalf("refund: %v, used %d cost %d; want 5 and 5", err, p.Used, p.Cost)
	}
	if err := p.Settle(ctx, 5); !errors.Is(err, vocab.ErrSettled) {
		t.Fatalf("a second settle: %v, want ErrSettled", err)
	}
	for _, c := range []struct {
		name   string
		actual int64
	}{{"negative", -1}, {"absurd", MaxLimit + 1}} {
		t.Run(c.name, func(t *testing.T) {
			p, err := l.AcquireN(ctx, "bob", 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Settle(ctx, c.actual); !errors.Is(err, vocab.ErrInvalidCost) {
				t.Fatalf("settle %d: %v, want ErrInvalidCost", c.actual, err)
			}
			if err := p.Settle(ctx, 1); err != nil {
				t.Fatalf("a valid settle after a refused one: %v", err)
			}
		})
	}
	for _, cost := range []int64{-1, MaxLimit + 1} {
		if _, err := l.AcquireN(ctx, "bob", cost); !errors.Is(err, vocab.ErrInvalidCost) {
			t.Fatalf("AcquireN(%d): %v, want ErrInvalidCost", cost, err)
		}
	}
	// A cost above the limit never fits: refused with no round trip and
	// no Retry-After.
	var le *LimitError
	if _, err := l.AcquireN(ctx, "bob", 101); !errors.As(err, &le) || le.RetryAfter != 0 {
		t.Fatalf("a cost above the limit: %v", err)
	}
	// A settle after the permit's context ended still charges: the work
	// was done.
	cctx, cancel := context.WithCancel(ctx)
	p, err = l.AcquireN(cctx, "bob", 1)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := p.Settle(cctx, 10); err != nil {
		t.Fatalf("settle after the context ended: %v", err)
	}
	st, err := l.Peek(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(5 + 1 + 1 + 10); st.Used != want {
		t.Fatalf("used %d, want %d", st.Used, want)
	}
	// A refund never takes use below zero (an operator reset it meanwhile).
	p, err = l.AcquireN(ctx, "carol", 50)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Reset(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	if err := p.Settle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if st, _ := l.Peek(ctx, "carol"); st.Used != 0 {
		t.Fatalf("after a reset and a refund: used %d, want 0", st.Used)
	}
	// A settle in a period that ended is left alone.
	p, err = at(l, time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)).AcquireN(ctx, "dave", 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := at(l, time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)).AcquireN(ctx, "dave", 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Settle(ctx, 50); err != nil {
		t.Fatal(err)
	}
	if st, _ := at(l, time.Date(2026, 1, 2, 11, 0, 0, 0, time.UTC)).Peek(ctx, "dave"); st.Used != 1 {
		t.Fatalf("a settle of yesterday's permit changed today's use to %d", st.Used)
	}
}

func TestPeekKeysReset(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.URL(t), 2)
	ctx := context.Background()
	l := newLimiter(t, pool, Options{Name: "plugin-bytes", Limit: 1000})
	other := newLimiter(t, pool, Options{Name: "other", Limit: 1000})
	if st, err := l.Peek(ctx, "nobody"); err != nil || st.Used != 0 || st.Remaining != 1000 || st.Reset.IsZero() {
		t.Fatalf("peek of a key never charged: %+v, %v", st, err)
	}
	for i := range 25 {
		if _, err := l.AcquireN(ctx, fmt.Sprintf("user:%02d", i), int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.AcquireN(ctx, "user:99", 1); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		st, err := l.Peek(ctx, "user:07")
		if err != nil || st.Used != 7 || st.Remaining != 993 {
			t.Fatalf("peek: %+v, %v; want 7 used, and peeking spends nothing", st, err)
		}
	}
	var keys []string
	after := ""
	for {
		page, err := l.Keys(ctx, after, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, s := range page {
			keys = append(keys, s.Key)
		}
		after = page[len(page)-1].Key
	}
	// user:00 was charged 0: it has a row, with nothing used.
	if len(keys) != 25 || keys[0] != "user:00" || keys[24] != "user:24" {
		t.Fatalf("keys paged by 10: %v", keys)
	}
	for _, max := range []int{0, -1, maxKeys + 1} {
		if _, err := l.Keys(ctx, "", max); err == nil {
			t.Fatalf("Keys with max %d: no error", max)
		}
	}
	if had, err := l.Reset(ctx, "user:07"); err != nil || !had {
		t.Fatalf("reset: %v %v", had, err)
	}
	if st, _ := l.Peek(ctx, "user:07"); st.Used != 0 {
		t.Fatalf("after reset: %d used", st.Used)
	}
	if had, _ := l.Reset(ctx, "user:07"); had {
		t.Fatal("a second reset found a row")
	}
	if st, _ := other.Peek(ctx, "user:99"); st.Used != 1 {
		t.Fatalf("another quota's key of a similar name: %d used", st.Used)
	}
}

// TestChargeTx: a charge inside the caller's transaction is kept exactly
// when it commits, gone when it rolls back, and two transactions charging
// one key take turns.
func TestChargeTx(t *testing.T) {
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			pool := pgtest.Pool(t, pgtest.URL(t), 4)
			ctx := context.Background()
			l := newLimiter(t, pool, Options{Name: "invoices", Limit: 10, Durable: durable})
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.ChargeTx(ctx, tx, "acme", 4); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			tx, err = pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p, err := l.ChargeTx(ctx, tx, "acme", 5)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Settle(ctx, 6); err != nil {
				t.Fatal(err)
			}
			// A second transaction on the key waits for the first.
			done := make(chan error, 1)
			go func() {
				tx2, err := pool.Begin(ctx)
				if err != nil {
					done <- err
					return
				}
				defer tx2.Rollback(ctx)
				_, err = l.ChargeTx(ctx, tx2, "acme", 6)
				if err == nil {
					err = tx2.Commit(ctx)
				}
				done <- err
			}()
			select {
			case err := <-done:
				t.Fatalf("a second transaction decided while the first held the key: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("after the first rolled back, 6 more fit on 4: %v", err)
			}
			if st, _ := l.Peek(ctx, "acme"); st.Used != 10 {
				t.Fatalf("used %d, want 10 (4 committed, 6 rolled back, 6 committed)", st.Used)
			}
			if _, err := l.ChargeTx(ctx, nil, "acme", 1); err == nil {
				t.Fatal("ChargeTx with a nil transaction")
			}
		})
	}
}

// TestChargeTxSurvivesACrash: on a throwaway server stopped in immediate
// mode (a crash) between a ledger charge and its commit, the committed
// charges are there after the restart and the uncommitted one is not; the
// UNLOGGED usage table is empty.
func TestChargeTxSurvivesACrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and crashes a server of its own")
	}
	c := pgtest.Cluster(t)
	ctx := context.Background()
	pool := pgtest.Pool(t, c.URL("postgres"), 4)
	if err := migrate.Limits(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ledger := newLimiter(t, pool, Options{Name: "billing", Limit: 100, Durable: true})
	usage := newLimiter(t, pool, Options{Name: "billing", Limit: 100})
	for range 3 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ledger.ChargeTx(ctx, tx, "acme", 7); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := usage.AcquireN(ctx, "acme", 9); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.ChargeTx(ctx, tx, "acme", 50); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	pool.Reset()
	var st State
	deadline := time.Now().Add(time.Minute)
	for {
		st, err = ledger.Peek(ctx, "acme")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if st.Used != 21 {
		t.Fatalf("after the crash the ledger says %d used, want 21 (3 × 7 committed, 50 never)", st.Used)
	}
	if st, err := usage.Peek(ctx, "acme"); err != nil || st.Used != 0 {
		t.Fatalf("after the crash the UNLOGGED usage says %d (%v), want 0", st.Used, err)
	}
}

// TestLedgerStatementsMirrorUsage keeps sql/queries/quota_ledger.sql the
// statements of quota_usage.sql on the other table.
func TestLedgerStatementsMirrorUsage(t *testing.T) {
	usage, err := os.ReadFile("../sql/queries/quota_usage.sql")
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := os.ReadFile("../sql/queries/quota_ledger.sql")
	if err != nil {
		t.Fatal(err)
	}
	body := func(s string) string { return s[strings.Index(s, "-- The period is computed"):] }
	want := strings.NewReplacer("quota_usage", "quota_ledger", "QuotaUsage", "QuotaLedger").Replace(body(string(usage)))
	if got := body(string(ledger)); got != want {
		t.Fatal("quota_ledger.sql is not quota_usage.sql's statements on pglimit.quota_ledger: edit both")
	}
}

// TestOverridesGiveKeysTheirLimit: a key with an override (package
// override) has its own limit under the quota's name, on every replica
// once it is in force there; other keys keep Limit; 0 allows nothing.
func TestOverridesGiveKeysTheirLimit(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	var limiters []*Limiter
	var stores []*override.Store
	for range 2 {
		pool := pgtest.Pool(t, url, 4)
		s, err := override.New(ctx, pool, override.Options{})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- s.Run(runCtx) }()
		t.Cleanup(func() { stop(); <-ran })
		stores = append(stores, s)
		limiters = append(limiters, newLimiter(t, pool, Options{Name: "api-quota", Limit: 2, Period: Day, Overrides: s}))
	}
	if _, err := stores[0].Set(ctx, "api-quota", "user:vip", 5, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := stores[0].Set(ctx, "api-quota", "user:blocked", 0, 0); err != nil {
		t.Fatal(err)
	}
	// Without a bus the second replica reloads within a second.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, ok := stores[1].Limit("api-quota", "user:blocked"); ok && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the override never reached the second replica")
		}
	}
	admitted := map[string]int{}
	for _, key := range []string{"user:vip", "user:plain", "user:blocked"} {
		for i := range 8 {
			p, err := limiters[i%2].Acquire(ctx, key)
			var le *LimitError
			switch {
			case err == nil:
				admitted[key]++
				if key == "user:vip" && p.Limit != 5 {
					t.Fatalf("vip's permit says limit %d", p.Limit)
				}
			case errors.As(err, &le):
				if want := map[string]int64{"user:vip": 5, "user:plain": 2, "user:blocked": 0}[key]; le.Limit != want {
					t.Fatalf("%s refused with limit %d, want %d", key, le.Limit, want)
				}
			default:
				t.Fatal(err)
			}
		}
	}
	if admitted["user:vip"] != 5 || admitted["user:plain"] != 2 || admitted["user:blocked"] != 0 {
		t.Fatalf("admitted %v, want vip 5, plain 2, blocked 0", admitted)
	}
}

// TestEachTableAlone: every operation of a Limiter — charge, settle, peek,
// keys, reset — reads and writes its own table alone (quota_ledger with
// Durable, quota_usage without), so a durable and an unlogged quota of the
// same name never see each other's use.
func TestEachTableAlone(t *testing.T) {
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			pool := pgtest.Pool(t, pgtest.URL(t), 4)
			ctx := context.Background()
			l := newLimiter(t, pool, Options{Name: "exports", Limit: 10, Durable: durable})
			other := newLimiter(t, pool, Options{Name: "exports", Limit: 10, Durable: !durable})
			if _, err := l.AcquireN(ctx, "acme", 3); err != nil {
				t.Fatal(err)
			}
			p, err := l.AcquireN(ctx, "globex", 4)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Settle(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if p.Used != 1 {
				t.Fatalf("settled permit: used %d, want 1", p.Used)
			}
			if _, err := other.AcquireN(ctx, "acme", 9); err != nil {
				t.Fatalf("the other table's quota is whole: %v", err)
			}
			keys, err := l.Keys(ctx, "", 10)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range keys {
				got = append(got, fmt.Sprintf("%s=%d", k.Key, k.Used))
			}
			if want := "acme=3 globex=1"; strings.Join(got, " ") != want {
				t.Fatalf("keys %v, want %s", got, want)
			}
			if had, err := l.Reset(ctx, "acme"); err != nil || !had {
				t.Fatalf("reset: had %v, %v; want true", had, err)
			}
			if had, err := l.Reset(ctx, "acme"); err != nil || had {
				t.Fatalf("second reset: had %v, %v; want false", had, err)
			}
			if st, err := l.Peek(ctx, "acme"); err != nil || st.Used != 0 {
				t.Fatalf("after reset: used %d, %v; want 0", st.Used, err)
			}
			if st, err := other.Peek(ctx, "acme"); err != nil || st.Used != 9 {
				t.Fatalf("the other table: used %d, %v; want 9", st.Used, err)
			}
		})
	}
}

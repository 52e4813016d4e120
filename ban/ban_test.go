package ban_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/ban"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

// counter is a pgx tracer that counts the statements a pool sends on
// pglimit.ban: the observer of "no statement", outside the package.
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "pglimit.ban") {
		c.n.Add(1)
	}
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// replica is a pool (a replica stand-in) with its tracer and its Bans.
type replica struct {
	pool  *pgxpool.Pool
	count *counter
	bans  *ban.Bans
}

// replicas opens n pools on url, each with a tracer, listening on the
// bus, each with a Bans under rule that has read the live bans.
func replicas(t *testing.T, url string, n int, rule ban.Options) []*replica {
	t.Helper()
	var out []*replica
	var pools []*pgxpool.Pool
	for range n {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 4
		c := &counter{}
		cfg.ConnConfig.Tracer = c
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		b, err := ban.New(pool, rule)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &replica{pool: pool, count: c, bans: b})
		pools = append(pools, pool)
	}
	pgtest.Listen(t, pools...)
	for _, r := range out {
		settle(t, r.bans)
	}
	return out
}

// settle waits until b has read the live bans in its bus's epoch.
func settle(t *testing.T, b *ban.Bans) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ban.Settled(b) {
		if time.Now().After(deadline) {
			t.Fatal("the bans were not read within 20s")
		}
		b.Banned(context.Background(), "warm-up")
		time.Sleep(5 * time.Millisecond)
	}
}

// dbUntil is key's ban end in the database, read by an observer pool.
func dbUntil(t *testing.T, obs *pgxpool.Pool, key string) time.Time {
	t.Helper()
	var until time.Time
	if err := obs.QueryRow(context.Background(), `SELECT until FROM pglimit.ban WHERE key = $1`, key).Scan(&until); err != nil {
		t.Fatal(err)
	}
	return until
}

// waitBanned waits until every replica's Banned says want for key, and
// returns how long it took.
func waitBanned(t *testing.T, rs []*replica, key string, want bool, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for _, r := range rs {
		for {
			if _, banned := r.bans.Banned(context.Background(), key); banned == want {
				break
			}
			if time.Since(start) > within {
				t.Fatalf("Banned(%q) is not %v on every replica within %v", key, want, within)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return time.Since(start)
}

func TestNewRefusesBadRules(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 1)
	for _, tc := range []struct {
		name string
		rule ban.Options
		want string
	}{
		{"zero", ban.Options{}, "Options.After 0"},
		{"negative after", ban.Options{After: -1, Within: time.Minute, For: time.Minute}, "Options.After -1"},
		{"after too large", ban.Options{After: 1_000_001, Within: time.Minute, For: time.Minute}, "Options.After 1000001"},
		{"no window", ban.Options{After: 5, For: time.Minute}, "Options.Within 0s"},
		{"negative window", ban.Options{After: 5, Within: -time.Second, For: time.Minute}, "Options.Within -1s"},
		{"window below a millisecond", ban.Options{After: 5, Within: time.Microsecond, For: time.Minute}, "Options.Within 1µs"},
		{"window above a year", ban.Options{After: 5, Within: 367 * 24 * time.Hour, For: time.Minute}, "Options.Within 8808h0m0s"},
		{"no ban", ban.Options{After: 5, Within: time.Minute}, "Options.For 0s"},
		{"negative ban", ban.Options{After: 5, Within: time.Minute, For: -time.Minute}, "Options.For -1m0s"},
		{"ban above a year", ban.Options{After: 5, Within: time.Minute, For: 367 * 24 * time.Hour}, "Options.For 8808h0m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ban.New(pool, tc.rule)
			if err == nil || b != nil {
				t.Fatalf("New(%+v) = %v, %v; want an error", tc.rule, b, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New(%+v): %q does not name %q", tc.rule, err, tc.want)
			}
		})
	}
	if _, err := ban.New(nil, ban.Options{After: 1, Within: time.Second, For: time.Second}); err == nil {
		t.Error("New(nil pool) did not fail")
	}
	if _, err := ban.New(pool, ban.Options{After: 1, Within: time.Millisecond, For: time.Millisecond}); err != nil {
		t.Errorf("the smallest rule: %v", err)
	}
}

// TestBanAcrossReplicas: a key refused After times on one replica is
// banned on all three within a second; thousands of checks of it (Banned,
// and Refused of the banned key) over the three make no statement (a pgx
// tracer on each pool counts them); every replica's end of the ban is
// within a few milliseconds of the database's, and the ban ends there.
func TestBanAcrossReplicas(t *testing.T) {
	t.Parallel()
	const after = 5
	_, url := pgtest.NewDB(t, 1)
	obs := pgtest.Pool(t, url, 1)
	rule := ban.Options{After: after, Within: time.Minute, For: 3 * time.Second}
	rs := replicas(t, url, 3, rule)
	ctx := context.Background()
	const key = "user:mallory"
	for i := 1; i <= after; i++ {
		until, banned, err := rs[0].bans.Refused(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if banned != (i == after) {
			t.Fatalf("refusal %d: banned %v (until %v)", i, banned, until)
		}
	}
	took := waitBanned(t, rs, key, true, time.Second)
	t.Logf("banned on every replica %v after the refusal that banned", took.Round(time.Microsecond))
	want := dbUntil(t, obs, key)
	var ends []time.Time
	for i, r := range rs {
		until, banned := r.bans.Banned(ctx, key)
		if !banned {
			t.Fatalf("replica %d: not banned", i)
		}
		// One machine, one clock: the replica's end is the database's, up
		// to the error of its estimate of the database clock (half the
		// round trip it was taken from: on a loaded machine that round
		// trip is slower) and 50 ms for the rest of the way.
		bound := ban.ClockError(r.bans) + 50*time.Millisecond
		if d := until.Round(0).Sub(want); d < -bound || d > bound {
			t.Errorf("replica %d: the ban ends at %v, %v from the database's %v (bound %v)", i, until, d, want, bound)
		} else {
			t.Logf("replica %d: ends %v from the database's end (bound %v)", i, d.Round(time.Microsecond), bound)
		}
		ends = append(ends, until)
	}

	before := make([]int64, len(rs))
	for i, r := range rs {
		before[i] = r.count.n.Load()
	}
	const checks = 3000
	var wg sync.WaitGroup
	var refusedFromMemory atomic.Int64
	for _, r := range rs {
		for range 4 {
			wg.Go(func() {
				for i := range checks / 4 {
					if _, banned := r.bans.Banned(ctx, key); !banned {
						t.Error("not banned during the ban")
						return
					}
					if i%10 == 0 {
						if _, banned, err := r.bans.Refused(ctx, key); err != nil || !banned {
							t.Errorf("Refused of a banned key: banned %v, %v", banned, err)
							return
						}
						refusedFromMemory.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	for i, r := range rs {
		if n := r.count.n.Load() - before[i]; n != 0 {
			t.Errorf("replica %d: %d statements on pglimit.ban for %d checks of a banned key, want 0", i, n, checks)
		}
	}
	t.Logf("%d Banned and %d Refused of the banned key over 3 replicas: 0 statements", 3*checks, refusedFromMemory.Load())

	// The ban ends when the replica's clock passes its end.
	for i, r := range rs {
		until := ends[i]
		time.Sleep(time.Until(until) - 5*time.Millisecond)
		if _, banned := r.bans.Banned(ctx, key); !banned && time.Until(until) > 0 {
			t.Errorf("replica %d: not banned %v before the end", i, time.Until(until))
		}
		time.Sleep(time.Until(until))
		if _, banned := r.bans.Banned(ctx, key); banned {
			t.Errorf("replica %d: still banned %v after the end", i, -time.Until(until))
		}
		if d := time.Since(want); d > 100*time.Millisecond {
			t.Logf("replica %d: checked %v after the database's end (a loaded machine)", i, d)
		}
	}
	// A refusal after the ban counts afresh.
	if _, banned, err := rs[1].bans.Refused(ctx, key); err != nil || banned {
		t.Errorf("the first refusal after the ban: banned %v, %v", banned, err)
	}
}

// TestLiftOnEveryReplica: an operator's Lift on one replica ends the ban
// on all three within a second; lifting it again says there was none.
func TestLiftOnEveryReplica(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewDB(t, 1)
	rs := replicas(t, url, 3, ban.Options{After: 2, Within: time.Minute, For: time.Hour})
	ctx := context.Background()
	const key = "address:192.0.2.7"
	for range 2 {
		if _, _, err := rs[2].bans.Refused(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	waitBanned(t, rs, key, true, time.Second)
	lifted, err := rs[0].bans.Lift(ctx, key)
	if err != nil || !lifted {
		t.Fatalf("Lift = %v, %v", lifted, err)
	}
	took := waitBanned(t, rs, key, false, time.Second)
	t.Logf("lifted on every replica within %v", took.Round(time.Microsecond))
	if lifted, err := rs[1].bans.Lift(ctx, key); err != nil || lifted {
		t.Errorf("Lift of a key not banned = %v, %v", lifted, err)
	}
	list, err := rs[1].bans.List(ctx)
	if err != nil || len(list) != 0 {
		t.Errorf("List after the lift = %v, %v", list, err)
	}
	// The count went with the ban: one refusal does not ban again.
	if _, banned, err := rs[1].bans.Refused(ctx, key); err != nil || banned {
		t.Errorf("the first refusal after the lift: banned %v, %v", banned, err)
	}
}

// TestWindowLapses: refusals count within the window their first one
// opened; after it they count afresh.
func TestWindowLapses(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewDB(t, 1)
	within := 1500 * time.Millisecond
	rs := replicas(t, url, 2, ban.Options{After: 3, Within: within, For: time.Hour})
	ctx := context.Background()
	const key = "token:42"
	refuse := func(r *replica, want bool) {
		t.Helper()
		_, banned, err := r.bans.Refused(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if banned != want {
			t.Fatalf("banned %v, want %v", banned, want)
		}
	}
	start := time.Now()
	refuse(rs[0], false)
	refuse(rs[1], false)
	time.Sleep(within - time.Since(start) + 200*time.Millisecond)
	// The window lapsed: these two open a new one.
	refuse(rs[1], false)
	refuse(rs[0], false)
	if time.Since(start) > 2*within {
		t.Skip("the machine is too loaded to hold the window")
	}
	refuse(rs[1], true)
	waitBanned(t, rs, key, true, time.Second)
	list, err := rs[0].bans.List(ctx)
	if err != nil || len(list) != 1 || list[0].Key != key || time.Until(list[0].Until) < 59*time.Minute {
		t.Errorf("List = %+v, %v", list, err)
	}
}

// TestReconnectReadsBans: a replica whose bus connects again reads the
// live bans again, so a ban (or a lift) whose notification it missed is
// known once it is back.
func TestReconnectReadsBans(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewDB(t, 1)
	obs := pgtest.Pool(t, url, 1)
	rs := replicas(t, url, 1, ban.Options{After: 1, Within: time.Minute, For: time.Hour})
	ctx := context.Background()
	// A ban written without a notification: one the replica missed.
	if _, err := obs.Exec(ctx, `INSERT INTO pglimit.ban (key, refusals, first_at, last_at, until, banned_at, expires_at)
		VALUES ('user:missed', 0, now(), now(), now() + interval '1 hour', now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, banned := rs[0].bans.Banned(ctx, "user:missed"); banned {
		t.Fatal("banned before the bus connected again: the test shows nothing")
	}
	reconnect := func() {
		t.Helper()
		var n int
		if err := obs.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%BusPing%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("terminated %d backends of the bus, want 1", n)
		}
	}
	reconnect()
	waitBanned(t, rs, "user:missed", true, 20*time.Second)
	// A lift it missed.
	if _, err := obs.Exec(ctx, `DELETE FROM pglimit.ban`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, banned := rs[0].bans.Banned(ctx, "user:missed"); !banned {
		t.Fatal("not banned before the bus connected again")
	}
	reconnect()
	waitBanned(t, rs, "user:missed", false, 20*time.Second)
}

// TestUserCannotBanAnother: the refusals of one key ban that key alone:
// an attacker refused as user:mallory, or under keys made to look like
// alice's (another case, spaces, a prefix, a key too long to store as it
// is), bans none of alice's keys on any replica.
func TestUserCannotBanAnother(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewDB(t, 1)
	rs := replicas(t, url, 2, ban.Options{After: 1, Within: time.Minute, For: time.Hour})
	ctx := context.Background()
	attacks := []string{"user:mallory", "user:Alice", "user:alice ", " user:alice", "user:alice\x00", "user:alic",
		"user:alice" + strings.Repeat("x", 300), "address:user:alice", "token:user:alice"}
	for _, k := range attacks {
		if _, banned, err := rs[0].bans.Refused(ctx, k); err != nil || !banned {
			t.Fatalf("Refused(%q) = %v, %v", k, banned, err)
		}
	}
	waitBanned(t, rs, "user:mallory", true, time.Second)
	for i, r := range rs {
		for _, k := range []string{"user:alice", "token:7", "address:192.0.2.1"} {
			if _, banned := r.bans.Banned(ctx, k); banned {
				t.Errorf("replica %d: %q is banned by another's refusals", i, k)
			}
		}
	}
	list, err := rs[1].bans.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != len(attacks) {
		t.Errorf("%d bans listed, want %d (one per key refused)", len(list), len(attacks))
	}
}

// TestRefusalsCoalesce: 2,400 refusals of one key at once over three
// replicas (eight callers each) ban it (After 1,000) in fewer statements
// than refusals — those arriving while a replica's statement for the key
// is under way travel together in its next one — and the ban is made by
// exactly one statement (one row, banned once).
func TestRefusalsCoalesce(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewDB(t, 1)
	obs := pgtest.Pool(t, url, 1)
	rs := replicas(t, url, 3, ban.Options{After: 1000, Within: time.Minute, For: time.Hour})
	before := make([]int64, len(rs))
	for i, r := range rs {
		before[i] = r.count.n.Load()
	}
	var wg sync.WaitGroup
	var banned atomic.Int64
	for _, r := range rs {
		for range 8 {
			wg.Go(func() {
				for range 100 {
					_, b, err := r.bans.Refused(context.Background(), "user:hammer")
					if err != nil {
						t.Error(err)
						return
					}
					if b {
						banned.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	var stmts int64
	for i, r := range rs {
		stmts += r.count.n.Load() - before[i]
	}
	t.Logf("2400 refusals: %d statements on pglimit.ban, %d answered banned", stmts, banned.Load())
	if banned.Load() == 0 {
		t.Error("never banned")
	}
	if stmts >= 2400 {
		t.Errorf("%d statements for 2400 refusals: none travelled together", stmts)
	}
	var n int
	if err := obs.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.ban WHERE until > now()`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d bans, %v", n, err)
	}
}

package access_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/access"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newRules makes the lists of pool and runs them until the test ends.
func newRules(t *testing.T, pool *pgxpool.Pool, log *slog.Logger) *access.Rules {
	t.Helper()
	if log == nil {
		log = quiet
	}
	r, err := access.New(context.Background(), pool, access.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func add(t *testing.T, r *access.Rules, list access.List, match string, expiresIn time.Duration) access.Rule {
	t.Helper()
	rule, err := r.Add(context.Background(), access.Rule{List: list, Match: match, ExpiresIn: expiresIn})
	if err != nil {
		t.Fatalf("Add(%v %q): %v", list, match, err)
	}
	return rule
}

// within waits up to d for r's answer for addr and keys to be want, and
// returns how long it took; it fails the test past d.
func within(t *testing.T, d time.Duration, r *access.Rules, want access.List, addr netip.Addr, keys ...string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if got := r.Match(addr, keys...); got == want {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("Match(%v, %q) is not %v within %v", addr, keys, want, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMatch: a table of rules and of requests against them — nesting
// either way, deny wins, IPv4-mapped IPv6 as IPv4, zones ignored, keys —
// and a rule that stops matching at its expiry without a reload.
func TestMatch(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	r, err := access.New(context.Background(), pool, access.Options{Logger: quiet}) // no Run: nothing reloads
	if err != nil {
		t.Fatal(err)
	}
	for _, rule := range []struct {
		list  access.List
		match string
	}{
		{access.Deny, "192.0.2.0/24"},
		{access.Allow, "192.0.2.7"},
		{access.Allow, "198.51.100.0/24"},
		{access.Deny, "198.51.100.128/25"},
		{access.Allow, "198.51.100.130"},
		{access.Allow, "2001:db8::/32"},
		{access.Deny, "2001:db8:1::/48"},
		{access.Allow, "fe80::/10"},
		{access.Allow, "user:alice"},
		{access.Deny, "token:9"},
		{access.Deny, "::ffff:203.0.113.0/120"}, // stored as 203.0.113.0/24
		{access.Allow, "100.64.1.2/8"},          // host bits cleared: 100.0.0.0/8
		{access.Deny, "100.64.0.0/10"},
		{access.Allow, "100.64.0.0/10"}, // the same prefix on both lists: deny wins
	} {
		add(t, r, rule.list, rule.match, 0)
	}
	addr := netip.MustParseAddr
	for _, c := range []struct {
		addr netip.Addr
		keys []string
		want access.List
	}{
		{addr("192.0.2.7"), nil, access.Deny}, // a narrower allow inside a deny: deny wins
		{addr("192.0.2.8"), nil, access.Deny},
		{addr("192.0.3.1"), nil, access.None},
		{addr("198.51.100.1"), nil, access.Allow},
		{addr("198.51.100.200"), nil, access.Deny}, // a narrower deny inside an allow
		{addr("198.51.100.130"), nil, access.Deny}, // allowed twice, denied once
		{addr("198.51.100.127"), nil, access.Allow},
		{addr("::ffff:198.51.100.1"), nil, access.Allow}, // IPv4-mapped IPv6 is IPv4
		{addr("::ffff:192.0.2.9"), nil, access.Deny},
		{addr("203.0.113.77"), nil, access.Deny}, // a mapped rule is an IPv4 rule
		{addr("100.1.2.3"), nil, access.Allow},
		{addr("100.64.5.5"), nil, access.Deny},
		{addr("2001:db8::1"), nil, access.Allow},
		{addr("2001:db8:1::5"), nil, access.Deny},
		{addr("2001:db8:2::5"), nil, access.Allow},
		{addr("2001:db9::1"), nil, access.None},
		{addr("::"), nil, access.None},
		{addr("fe80::1%eth0"), nil, access.Allow}, // the zone is ignored
		{netip.Addr{}, []string{"user:alice"}, access.Allow},
		{netip.Addr{}, []string{"user:alice", "token:9"}, access.Deny},
		{netip.Addr{}, []string{"user:bob"}, access.None},
		{netip.Addr{}, []string{"user:Alice"}, access.None}, // keys are matched exactly
		{addr("198.51.100.1"), []string{"token:9"}, access.Deny},
		{addr("192.0.2.1"), []string{"user:alice"}, access.Deny},
		{addr("203.0.114.1"), []string{"user:alice"}, access.Allow},
	} {
		if got := r.Match(c.addr, c.keys...); got != c.want {
			t.Errorf("Match(%v, %q) = %v, want %v", c.addr, c.keys, got, c.want)
		}
	}

	// Expiry: in force until its time, then not, with no reload.
	add(t, r, access.Deny, "10.0.0.0/8", 1500*time.Millisecond)
	add(t, r, access.Allow, "user:carol", 1500*time.Millisecond)
	added := time.Now()
	if got := r.Match(addr("10.1.2.3")); got != access.Deny && time.Since(added) < time.Second {
		t.Errorf("a rule expiring in 1.5 s: Match = %v right after Add, want deny", got)
	}
	if got := r.Match(netip.Addr{}, "user:carol"); got != access.Allow && time.Since(added) < time.Second {
		t.Errorf("a key rule expiring in 1.5 s: Match = %v right after Add, want allow", got)
	}
	time.Sleep(1600*time.Millisecond - time.Since(added))
	if got := r.Match(addr("10.1.2.3")); got != access.None {
		t.Errorf("a rule that lapsed: Match = %v, want none", got)
	}
	if got := r.Match(netip.Addr{}, "user:carol"); got != access.None {
		t.Errorf("a key rule that lapsed: Match = %v, want none", got)
	}
	rules, err := r.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, rule := range rules {
		if rule.Match == "10.0.0.0/8" || rule.Match == "user:carol" {
			t.Errorf("List has the lapsed rule %+v", rule)
		}
	}
}

// TestAddRefusesBadInput: a rule that cannot be used is a *FieldError
// naming its field, and writes nothing; a rule for every address is taken
// and logged at WARN.
func TestAddRefusesBadInput(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	var out bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &out}, nil))
	r, err := access.New(context.Background(), pool, access.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		rule  access.Rule
		field string
	}{
		{"empty", access.Rule{List: access.Deny}, "match"},
		{"blank", access.Rule{List: access.Deny, Match: "   "}, "match"},
		{"no list", access.Rule{Match: "192.0.2.1"}, "list"},
		{"unknown list", access.Rule{List: access.List(7), Match: "192.0.2.1"}, "list"},
		{"CIDR length past 32", access.Rule{List: access.Deny, Match: "10.0.0.0/33"}, "match"},
		{"CIDR length past 128", access.Rule{List: access.Deny, Match: "2001:db8::/129"}, "match"},
		{"CIDR without length", access.Rule{List: access.Deny, Match: "10.0.0.0/"}, "match"},
		{"octet past 255", access.Rule{List: access.Deny, Match: "300.1.1.1"}, "match"},
		{"three octets", access.Rule{List: access.Deny, Match: "10.1.1/24"}, "match"},
		{"bad IPv6", access.Rule{List: access.Deny, Match: "2001:db8:::1"}, "match"},
		{"zone", access.Rule{List: access.Deny, Match: "fe80::1%eth0"}, "match"},
		{"mapped prefix shorter than /96", access.Rule{List: access.Deny, Match: "::ffff:0:0/80"}, "match"},
		{"no kind", access.Rule{List: access.Deny, Match: "alice"}, "match"},
		{"empty kind", access.Rule{List: access.Deny, Match: ":alice"}, "match"},
		{"empty value", access.Rule{List: access.Deny, Match: "user:"}, "match"},
		{"upper-case kind", access.Rule{List: access.Deny, Match: "User:alice"}, "match"},
		{"kind with a space", access.Rule{List: access.Deny, Match: "us er:alice"}, "match"},
		{"control character", access.Rule{List: access.Deny, Match: "user:al\x00ice"}, "match"},
		{"newline", access.Rule{List: access.Deny, Match: "user:al\nice"}, "match"},
		{"invalid UTF-8", access.Rule{List: access.Deny, Match: "user:\xff"}, "match"},
		{"key too long", access.Rule{List: access.Deny, Match: "user:" + strings.Repeat("a", 300)}, "match"},
		{"negative expiry", access.Rule{List: access.Deny, Match: "192.0.2.1", ExpiresIn: -time.Second}, "expiresIn"},
		{"expiry past 100 years", access.Rule{List: access.Deny, Match: "192.0.2.1", ExpiresIn: 101 * 365 * 24 * time.Hour}, "expiresIn"},
	} {
		_, err := r.Add(context.Background(), c.rule)
		var fe *access.FieldError
		if !errors.As(err, &fe) {
			t.Errorf("%s: Add(%+v) = %v, want a *FieldError", c.name, c.rule, err)
			continue
		}
		if fe.Field != c.field {
			t.Errorf("%s: field %q, want %q (%v)", c.name, fe.Field, c.field, err)
		}
	}
	if rules, err := r.List(context.Background()); err != nil || len(rules) != 0 {
		t.Fatalf("refused rules wrote %d rules (%v)", len(rules), err)
	}
	mu.Lock()
	if out.Len() != 0 {
		t.Errorf("refusals logged: %s", out.String())
	}
	mu.Unlock()

	// Every address: taken, and logged at WARN.
	for _, m := range []string{"0.0.0.0/0", "::/0"} {
		rule := add(t, r, access.Allow, m, 0)
		if rule.Match != m || rule.ID == 0 || !rule.ExpiresAt.IsZero() {
			t.Errorf("Add(%q) = %+v", m, rule)
		}
	}
	mu.Lock()
	if got := strings.Count(out.String(), "level=WARN"); got != 2 {
		t.Errorf("two rules for every address logged %d warnings:\n%s", got, out.String())
	}
	mu.Unlock()
	if got := r.Match(netip.MustParseAddr("203.0.113.9")); got != access.Allow {
		t.Errorf("0.0.0.0/0 allow: Match = %v", got)
	}
	if got := r.Match(netip.MustParseAddr("2001:db8::9")); got != access.Allow {
		t.Errorf("::/0 allow: Match = %v", got)
	}
	// Normalised forms.
	for in, want := range map[string]string{
		" 192.0.2.7 ":       "192.0.2.7",
		"192.0.2.7/32":      "192.0.2.7",
		"192.0.2.77/24":     "192.0.2.0/24",
		"::ffff:192.0.2.1":  "192.0.2.1",
		"2001:DB8::1/48":    "2001:db8::/48",
		"token:42":          "token:42",
		"user:ünïcode name": "user:ünïcode name",
	} {
		if got := add(t, r, access.Deny, in, time.Hour).Match; got != want {
			t.Errorf("Add(%q) stored %q, want %q", in, got, want)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestRulesAcrossReplicas: a rule added on replica A (a pool, a bus and
// lists of its own) is in force on replica B within a second, and its
// removal too; A has it when Add returns.
func TestRulesAcrossReplicas(t *testing.T) {
	t.Parallel()
	poolA, url := pgtest.NewDB(t, 4)
	poolB := pgtest.Pool(t, url, 4)
	pgtest.Listen(t, poolA, poolB)
	a, b := newRules(t, poolA, nil), newRules(t, poolB, nil)
	denied := netip.MustParseAddr("192.0.2.44")
	for round := range 5 {
		rule := add(t, a, access.Deny, "192.0.2.0/24", 0)
		if got := a.Match(denied); got != access.Deny {
			t.Fatalf("round %d: on the replica that added it, Match = %v when Add returned", round, got)
		}
		took := within(t, time.Second, b, access.Deny, denied)
		keyRule := add(t, a, access.Allow, "user:dave", 0)
		tookKey := within(t, time.Second, b, access.Allow, netip.Addr{}, "user:dave")
		if ok, err := a.Remove(context.Background(), rule.ID); err != nil || !ok {
			t.Fatalf("Remove: %v %v", ok, err)
		}
		if got := a.Match(denied); got != access.None {
			t.Fatalf("round %d: on the replica that removed it, Match = %v when Remove returned", round, got)
		}
		tookOut := within(t, time.Second, b, access.None, denied)
		if _, err := b.Remove(context.Background(), keyRule.ID); err != nil {
			t.Fatal(err)
		}
		within(t, time.Second, a, access.None, netip.Addr{}, "user:dave")
		t.Logf("round %d: in force on the other replica after %v (a key: %v), out of force after %v", round, took, tookKey, tookOut)
	}
	if ok, err := a.Remove(context.Background(), 1<<40); err != nil || ok {
		t.Errorf("Remove of no rule = %v, %v; want false, nil", ok, err)
	}
}

// TestReloadOnReconnect: a change the bus did not carry (written without
// a notification) is not seen while the bus is Live, and is seen once the
// bus has connected again: a replica whose bus was down may have missed a
// change.
func TestReloadOnReconnect(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	pgtest.Listen(t, pool)
	r := newRules(t, pool, nil)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO pglimit.access_rule (list, match) VALUES ('deny', '192.0.2.0/24')`); err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("192.0.2.1")
	epoch := bus.For(pool).Epoch()
	time.Sleep(2 * time.Second)
	switch got := r.Match(a); {
	case bus.For(pool).Epoch() != epoch:
		t.Logf("the bus was not live throughout (a loaded machine): whether the lists are polled while it is live is not judged")
	case got != access.None:
		t.Fatalf("a change without a notification was seen while the bus was live (Match = %v): the lists are polled", got)
	}
	var terminated int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%BusPing%'`).Scan(&terminated); err != nil {
		t.Fatal(err)
	}
	if terminated != 1 {
		t.Fatalf("terminated %d backends of the bus, want 1", terminated)
	}
	took := within(t, 20*time.Second, r, access.Deny, a)
	t.Logf("seen %v after the bus's connection was terminated", took)
}

// TestReloadWithoutBus: with no bus (pglimit.Run not running, or a pooler
// that does not pass notifications) a replica reloads once a second.
func TestReloadWithoutBus(t *testing.T) {
	t.Parallel()
	poolA, url := pgtest.NewDB(t, 4)
	poolB := pgtest.Pool(t, url, 4)
	a, b := newRules(t, poolA, nil), newRules(t, poolB, nil)
	addr := netip.MustParseAddr("2001:db8:5::1")
	var worst time.Duration
	for range 3 {
		rule := add(t, a, access.Deny, "2001:db8::/32", 0)
		// A second of polling, a tick and a statement; more on a loaded
		// machine.
		worst = max(worst, within(t, 5*time.Second, b, access.Deny, addr))
		if _, err := a.Remove(context.Background(), rule.ID); err != nil {
			t.Fatal(err)
		}
		worst = max(worst, within(t, 5*time.Second, b, access.None, addr))
	}
	t.Logf("without a bus, a change was seen within %v", worst)
	if worst > 4*time.Second {
		t.Errorf("without a bus a change took %v to be seen, want about a second", worst)
	}
}

// TestReloadFailureKeepsTheLists: while reloads fail (here, the pool is
// closed) the lists loaded before stay in force, and the failure is logged
// once, not once a second.
func TestReloadFailureKeepsTheLists(t *testing.T) {
	t.Parallel()
	_, url := pgtest.NewDB(t, 2)
	pool := pgtest.Pool(t, url, 2)
	var out bytes.Buffer
	var mu sync.Mutex
	r := newRules(t, pool, slog.New(slog.NewTextHandler(lockedWriter{&mu, &out}, nil)))
	add(t, r, access.Deny, "192.0.2.0/24", 0)
	pool.Close()
	time.Sleep(3500 * time.Millisecond) // three reloads, at least, without a bus
	if got := r.Match(netip.MustParseAddr("192.0.2.1")); got != access.Deny {
		t.Errorf("while reloads fail: Match = %v, want the deny loaded before", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(out.String(), "level=WARN"); n != 1 {
		t.Errorf("%d warnings while reloads failed, want 1:\n%s", n, out.String())
	}
}

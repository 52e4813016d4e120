package override_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
	"github.com/pglimit/pglimit/override"
	"github.com/pglimit/pglimit/quota"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// replica is a pool with, when withBus, its bus running and Live.
func replica(t *testing.T, url string, withBus bool) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t, url, 4)
	if withBus {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = bus.Run(ctx, pool, quiet) }()
		t.Cleanup(func() { cancel(); <-done })
		for deadline := time.Now().Add(30 * time.Second); !bus.For(pool).Live(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the bus did not turn Live in 30 s")
			}
		}
	}
	return pool
}

func newStore(t *testing.T, pool *pgxpool.Pool) *override.Store {
	t.Helper()
	s, err := override.New(context.Background(), pool, override.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("Run = %v, want nil once ctx ends", err)
		}
	})
	return s
}

// TestRunOnce: of two Runs of one Store, one returns an error at once and
// the other runs until its ctx ends, then returns nil.
func TestRunOnce(t *testing.T) {
	t.Parallel()
	s, err := override.New(context.Background(), replica(t, pgtest.URL(t), true), override.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 2)
	for range 2 {
		go func() { ran <- s.Run(ctx) }()
	}
	select {
	case err := <-ran:
		if err == nil {
			t.Error("the first Run to return returned nil before its ctx ended, want an error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("neither Run returned in 30 s: a second Run runs too")
	}
	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Errorf("Run = %v once its ctx ended, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return in 30 s after its ctx ended")
	}
}

// inForce is the bound of "within a second": the second the contract
// gives, and one more for a machine so loaded that a notification or a
// reload waits for the CPU (the measured times are logged; with the bus
// they are milliseconds).
const inForce = 2 * time.Second

func TestOverridesAcrossReplicas(t *testing.T) {
	url := pgtest.URL(t)
	a, b, c := newStore(t, replica(t, url, true)), newStore(t, replica(t, url, true)), newStore(t, replica(t, url, true))
	ctx := context.Background()
	if _, ok := b.Limit("quota", "user:bob"); ok {
		t.Fatal("an override before any was set")
	}
	o, err := a.Set(ctx, "quota", "user:bob", 5000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if o.Limit != 5000 || !o.ExpiresAt.IsZero() || o.UpdatedAt.IsZero() {
		t.Fatalf("Set returned %+v", o)
	}
	if n, ok := a.Limit("quota", "user:bob"); !ok || n != 5000 {
		t.Fatal("the replica that set it does not have it when Set returns")
	}
	for i, s := range []*override.Store{b, c} {
		took := wait.For(t, inForce, "the override on another replica", func() bool { n, ok := s.Limit("quota", "user:bob"); return ok && n == 5000 })
		t.Logf("set: in force on replica %d after %s", i+2, took)
	}
	if _, err := b.Set(ctx, "quota", "user:bob", 0, 0); err != nil {
		t.Fatal(err)
	}
	took := wait.For(t, inForce, "the changed override", func() bool { n, ok := c.Limit("quota", "user:bob"); return ok && n == 0 })
	t.Logf("changed to 0: in force on replica 3 after %s", took)
	if had, err := c.Remove(ctx, "quota", "user:bob"); err != nil || !had {
		t.Fatalf("remove: %v %v", had, err)
	}
	took = wait.For(t, inForce, "the removal", func() bool { _, ok := a.Limit("quota", "user:bob"); return !ok })
	t.Logf("removed: out of force on replica 1 after %s", took)
	if had, _ := c.Remove(ctx, "quota", "user:bob"); had {
		t.Fatal("a second removal found one")
	}
	// Other keys and policies were never touched.
	if _, ok := a.Limit("api", "user:bob"); ok {
		t.Fatal("another policy of the same key has an override")
	}
}

// TestReloadWithoutBus: replicas whose bus is not Live (as behind a proxy
// that passes no notifications) reload everything once a second.
func TestReloadWithoutBus(t *testing.T) {
	url := pgtest.URL(t)
	a, b := newStore(t, replica(t, url, false)), newStore(t, replica(t, url, false))
	ctx := context.Background()
	if _, err := a.Set(ctx, "api", "token:t1", 7, 0); err != nil {
		t.Fatal(err)
	}
	took := wait.For(t, inForce, "the override without a bus", func() bool { n, ok := b.Limit("api", "token:t1"); return ok && n == 7 })
	t.Logf("without a bus: in force after %s (a reload a second)", took)
	if _, err := a.Remove(ctx, "api", "token:t1"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, inForce, "the removal without a bus", func() bool { _, ok := b.Limit("api", "token:t1"); return !ok })
}

// TestNewLoadsWhatIsThere: a replica that starts later has every override
// at once, and one that has expired is not loaded.
func TestNewLoadsWhatIsThere(t *testing.T) {
	url := pgtest.URL(t)
	a := newStore(t, replica(t, url, false))
	ctx := context.Background()
	for i := range 50 {
		if _, err := a.Set(ctx, "quota", fmt.Sprintf("tenant:%02d", i), int64(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Set(ctx, "quota", "trial", 99, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	b := newStore(t, replica(t, url, false))
	for i := range 50 {
		if n, ok := b.Limit("quota", fmt.Sprintf("tenant:%02d", i)); !ok || n != int64(i) {
			t.Fatalf("tenant:%02d: %d %v", i, n, ok)
		}
	}
	if _, ok := b.Limit("quota", "trial"); ok {
		t.Fatal("an expired override was loaded")
	}
	var keys []string
	after := ""
	for {
		page, err := b.List(ctx, "quota", after, 20)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, o := range page {
			keys = append(keys, o.Key)
		}
		after = page[len(page)-1].Key
	}
	if len(keys) != 50 || keys[0] != "tenant:00" || keys[49] != "tenant:49" {
		t.Fatalf("listed %d: %v", len(keys), keys)
	}
}

// TestExpiry: an override with a ttl stops applying at its time on every
// replica, with no reload.
func TestExpiry(t *testing.T) {
	url := pgtest.URL(t)
	a, b := newStore(t, replica(t, url, true)), newStore(t, replica(t, url, true))
	ctx := context.Background()
	o, err := a.Set(ctx, "quota", "trial:acme", 1_000_000, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.ExpiresAt.Sub(o.UpdatedAt); got < 1499*time.Millisecond || got > 1501*time.Millisecond {
		t.Fatalf("expires %s after it was set, want 1.5s", got)
	}
	wait.For(t, inForce, "the trial on another replica", func() bool { _, ok := b.Limit("quota", "trial:acme"); return ok })
	for _, s := range []*override.Store{a, b} {
		wait.For(t, 10*time.Second, "the trial's end", func() bool { _, ok := s.Limit("quota", "trial:acme"); return !ok })
		if time.Now().Before(o.ExpiresAt.Add(-100 * time.Millisecond)) {
			t.Fatalf("ended before its time %s", o.ExpiresAt)
		}
	}
}

func TestSetRefusesBadInput(t *testing.T) {
	s := newStore(t, replica(t, pgtest.URL(t), false))
	ctx := context.Background()
	cases := []struct {
		name, policy, key string
		limit             int64
		ttl               time.Duration
	}{
		{"empty policy", "", "k", 1, 0},
		{"a slash in the policy", "quota/x", "k", 1, 0},
		{"a newline in the policy", "quo\nta", "k", 1, 0},
		{"a long policy", strings.Repeat("p", 201), "k", 1, 0},
		{"empty key", "quota", "", 1, 0},
		{"a NUL in the key", "quota", "a\x00b", 1, 0},
		{"a newline in the key", "quota", "a\nb", 1, 0},
		{"invalid UTF-8", "quota", "\xff", 1, 0},
		{"a long key", "quota", strings.Repeat("k", 1001), 1, 0},
		{"a negative limit", "quota", "k", -1, 0},
		{"an absurd limit", "quota", "k", quota.MaxLimit + 1, 0},
		{"a negative ttl", "quota", "k", 1, -time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := s.Set(ctx, c.policy, c.key, c.limit, c.ttl); !errors.Is(err, override.ErrInvalid) {
				t.Fatalf("Set: %v, want ErrInvalid", err)
			}
			if _, err := s.Remove(ctx, c.policy, c.key); c.limit >= 0 && c.limit <= quota.MaxLimit && c.ttl >= 0 && !errors.Is(err, override.ErrInvalid) {
				t.Fatalf("Remove: %v, want ErrInvalid", err)
			}
		})
	}
	for _, max := range []int{0, -1, 1001} {
		if _, err := s.List(ctx, "quota", "", max); !errors.Is(err, override.ErrInvalid) {
			t.Fatalf("List max %d: %v", max, err)
		}
	}
	// A key with a slash stays under its own policy.
	if _, err := s.Set(ctx, "quota", "a/b", 3, 0); err != nil {
		t.Fatal(err)
	}
	if n, ok := s.Limit("quota", "a/b"); !ok || n != 3 {
		t.Fatal("a key with a slash")
	}
	if _, ok := s.Limit("quota/a", "b"); ok {
		t.Fatal("a key with a slash reached another policy")
	}
}

func BenchmarkLimit(b *testing.B) {
	s := newStoreB(b)
	ctx := context.Background()
	for i := range 10_000 {
		if _, err := s.Set(ctx, "quota", fmt.Sprintf("tenant:%05d", i), int64(i), 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, ok := s.Limit("quota", "tenant:04242"); !ok {
			b.Fatal("missing")
		}
	}
}

func newStoreB(b *testing.B) *override.Store {
	pool := pgtest.Pool(b, pgtest.URL(b), 4)
	s, err := override.New(context.Background(), pool, override.Options{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

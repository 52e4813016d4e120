package replica_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
	"github.com/pglimit/pglimit/replica"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newRegistry(t *testing.T, pool *pgxpool.Pool, name string, interval time.Duration) *replica.Registry {
	t.Helper()
	// A generous timeout: on a loaded machine (CI runs packages side by
	// side) a first heartbeat may take longer than a short interval.
	r, err := replica.New(pool, replica.Options{Name: name, Interval: interval, Timeout: 2 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// start runs r in the background until the returned stop is called (or
// the test ends); stop returns Run's result.
func start(t *testing.T, r *replica.Registry) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// started runs r and waits for its first heartbeat to succeed.
func started(t *testing.T, r *replica.Registry) (stop func() error) {
	t.Helper()
	stop = start(t, r)
	wait.For(t, 5*time.Second, "Ready after Run started", r.Ready)
	return stop
}

// row is what an independent observer reads of one replica row.
type row struct {
	ready                       bool
	started, heartbeat, expires time.Time
	ttl                         time.Duration // expires_at - heartbeat_at
	countsNow                   bool
}

// observe reads the replica table from the observer's own pool; ok false
// when the row is missing.
func observe(t *testing.T, obs *pgxpool.Pool, name string) (row, bool) {
	t.Helper()
	var r row
	var ttlMs float64
	err := obs.QueryRow(context.Background(), `
		SELECT ready, started_at, heartbeat_at, expires_at,
		       extract(epoch FROM expires_at - heartbeat_at) * 1000, ready AND expires_at > now()
		FROM pglimit.replica WHERE name = $1`, name).
		Scan(&r.ready, &r.started, &r.heartbeat, &r.expires, &ttlMs, &r.countsNow)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	r.ttl = time.Duration(ttlMs) * time.Millisecond
	return r, true
}

func readyCount(t *testing.T, r *replica.Registry) int {
	t.Helper()
	n, err := r.ReadyReplicas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLifecycle: a replica registers a ready row when Run starts,
// heartbeats it, marks it not ready when draining, and deletes it when
// Run's context ends; another replica's count follows every step.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	obs := pgtest.Pool(t, url, 2)
	const interval = 100 * time.Millisecond
	a := newRegistry(t, pgtest.Pool(t, url, 2), "a", interval)
	b := newRegistry(t, pgtest.Pool(t, url, 2), "b", interval)
	ctx := context.Background()

	if a.Ready() {
		t.Fatal("Ready before Run")
	}
	if _, ok := observe(t, obs, "a"); ok {
		t.Fatal("row before Run")
	}
	stopA := started(t, a)
	started(t, b)
	first, ok := observe(t, obs, "a")
	if !ok || !first.ready || !first.countsNow {
		t.Fatalf("row after Run started: %+v present %v", first, ok)
	}
	if first.ttl != replica.Lapse*interval {
		t.Fatalf("row lapses %v after its heartbeat, want 3 intervals (%v)", first.ttl, replica.Lapse*interval)
	}
	if n := readyCount(t, b); n != 2 {
		t.Fatalf("ready replicas = %d, want 2", n)
	}
	wait.For(t, 2*time.Second, "heartbeat_at advances", func() bool {
		r, ok := observe(t, obs, "a")
		return ok && r.heartbeat.After(first.heartbeat) && r.started.Equal(first.started)
	})

	if err := a.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Ready() {
		t.Fatal("Ready while draining")
	}
	drained, ok := observe(t, obs, "a")
	if !ok || drained.ready {
		t.Fatalf("row while draining: %+v present %v; want present, not ready", drained, ok)
	}
	if n := readyCount(t, b); n != 1 {
		t.Fatalf("ready replicas with a draining = %d, want 1", n)
	}
	time.Sleep(3 * interval) // heartbeats go on while draining, still not ready
	if r, ok := observe(t, obs, "a"); !ok || r.ready || !r.heartbeat.After(drained.heartbeat) {
		t.Fatalf("row after draining for a while: %+v present %v", r, ok)
	}

	if err := stopA(); err != nil {
		t.Fatalf("Run returned %v when its context ended, want nil", err)
	}
	if _, ok := observe(t, obs, "a"); ok {
		t.Fatal("row still there after Run ended")
	}
	if a.Ready() {
		t.Fatal("Ready after Run ended")
	}
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatalf("Heartbeat after Run ended: %v", err)
	}
	time.Sleep(2 * interval) // no heartbeat brings it back
	if _, ok := observe(t, obs, "a"); ok {
		t.Fatal("row came back after Run ended")
	}
	if err := a.Run(ctx); !errors.Is(err, replica.ErrStarted) {
		t.Fatalf("second Run: %v, want ErrStarted", err)
	}
	if list, err := b.List(ctx); err != nil || len(list) != 1 || list[0].Name != "b" || !list[0].Ready {
		t.Fatalf("List = %+v, %v; want only b, ready", list, err)
	}
}

// TestStaleRowNotCounted: a replica that stops heartbeating without ending Run
// (its database connection is gone) is counted until its row is three
// intervals old, then no more.
func TestStaleRowNotCounted(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	obs := pgtest.Pool(t, url, 2)
	const interval = 300 * time.Millisecond
	a := newRegistry(t, pgtest.Pool(t, url, 2), "a", interval)
	poolB := pgtest.Pool(t, url, 2)
	b := newRegistry(t, poolB, "b", interval)
	ctx := context.Background()
	for _, r := range []*replica.Registry{a, b} {
		started(t, r)
	}
	if n := readyCount(t, a); n != 2 {
		t.Fatalf("ready replicas = %d, want 2", n)
	}
	poolB.Close() // b keeps running but its heartbeats fail from now on
	last, _ := observe(t, obs, "b")
	wait.For(t, 5*time.Second, "b stops being counted", func() bool { return readyCount(t, a) == 1 })
	var stale bool
	if err := obs.QueryRow(ctx, `SELECT now() - heartbeat_at >= $1::interval FROM pglimit.replica WHERE name = 'b'`,
		(replica.Lapse * interval).String()).Scan(&stale); err != nil {
		t.Fatal(err)
	}
	if !stale {
		t.Fatal("b stopped counting before its row was three intervals old")
	}
	if r, _ := observe(t, obs, "b"); !r.heartbeat.Equal(last.heartbeat) {
		t.Fatal("b's row was refreshed after its pool closed")
	}
	wait.For(t, 2*time.Second, "b reports not ready", func() bool { return !b.Ready() && b.LastError() != nil })
}

// TestCountNeverBelowOne: an empty table, or only rows not ready, still
// count the caller.
func TestCountNeverBelowOne(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a := newRegistry(t, pgtest.Pool(t, url, 2), "a", time.Second)
	if n := readyCount(t, a); n != 1 {
		t.Fatalf("empty table: ready replicas = %d, want 1", n)
	}
	b := newRegistry(t, pgtest.Pool(t, url, 2), "b", time.Second)
	ctx := context.Background()
	started(t, b)
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := readyCount(t, a); n != 1 {
		t.Fatalf("only a draining row: ready replicas = %d, want 1", n)
	}
}

// TestCountsItselfBeforeItsRow: a replica counts itself from New on,
// before its first heartbeat writes its row (the others do not count it
// yet), and no more once it drains.
func TestCountsItselfBeforeItsRow(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a := newRegistry(t, pgtest.Pool(t, url, 2), "a", time.Second)
	b := newRegistry(t, pgtest.Pool(t, url, 2), "b", time.Second)
	started(t, b)
	if n := readyCount(t, a); n != 2 {
		t.Fatalf("a before its first heartbeat, b running: a counts %d ready, want 2", n)
	}
	if n := readyCount(t, b); n != 1 {
		t.Fatalf("b counts %d ready before a's row is written, want 1", n)
	}
	if err := a.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := readyCount(t, a); n != 1 {
		t.Fatalf("a after Drain counts %d ready, want 1 (b)", n)
	}
	c := newRegistry(t, pgtest.Pool(t, url, 2), "c", time.Second)
	started(t, c)
	if n := readyCount(t, b); n != 2 {
		t.Fatalf("b counts %d ready with c running, want 2", n)
	}
	if n := readyCount(t, c); n != 2 {
		t.Fatalf("c counts %d ready once its row is written, want 2 (itself once)", n)
	}
}

// TestRowRecreatedAfterTruncate: a crash of the database empties the
// UNLOGGED table (TRUNCATE stands in for it); the next heartbeat writes the
// row again, with the replica's original start.
func TestRowRecreatedAfterTruncate(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	obs := pgtest.Pool(t, url, 2)
	const interval = 100 * time.Millisecond
	a := newRegistry(t, pgtest.Pool(t, url, 2), "a", interval)
	ctx := context.Background()
	started(t, a)
	before, _ := observe(t, obs, "a")
	time.Sleep(20 * time.Millisecond)
	if _, err := obs.Exec(ctx, `TRUNCATE pglimit.replica`); err != nil {
		t.Fatal(err)
	}
	if n := readyCount(t, a); n != 1 {
		t.Fatalf("after TRUNCATE: ready replicas = %d, want 1", n)
	}
	var after row
	wait.For(t, 2*time.Second, "row re-created", func() bool {
		var ok bool
		after, ok = observe(t, obs, "a")
		return ok
	})
	if !after.ready || !after.countsNow || !after.started.Equal(before.started) {
		t.Fatalf("re-created row %+v; want ready, started_at %v", after, before.started)
	}
	if !a.Ready() {
		t.Fatal("not Ready after the row came back")
	}
}

// TestSurvivesDatabaseCrash: the database crashes (immediate shutdown,
// crash recovery empties the UNLOGGED table) and comes back; meanwhile
// heartbeats fail without harm, Ready says false, and once the database is
// back the registry writes its row again and is Ready.
func TestSurvivesDatabaseCrash(t *testing.T) {
	t.Parallel()
	c := pgtest.Cluster(t)
	pool := pgtest.Pool(t, c.URL("postgres"), 2)
	ctx := context.Background()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	a := newRegistry(t, pool, "a", 100*time.Millisecond)
	started(t, a)
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 5*time.Second, "not Ready while the database is down", func() bool { return !a.Ready() })
	if a.LastError() == nil {
		t.Fatal("no LastError while the database is down")
	}
	time.Sleep(300 * time.Millisecond) // several failed heartbeats
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "Ready again", a.Ready)
	obs := pgtest.Pool(t, c.URL("postgres"), 1)
	if r, ok := observe(t, obs, "a"); !ok || !r.ready {
		t.Fatalf("row after the crash: %+v present %v", r, ok)
	}
}

// TestHeartbeatFailureHarmless: a registry whose database cannot be
// reached runs, reports the error, keeps trying, and ends without an error
// or a panic when its context ends, logging that its row could not be
// removed.
func TestHeartbeatFailureHarmless(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 1)
	pool.Close()
	var logged syncBuffer
	a, err := replica.New(pool, replica.Options{Name: "a", Interval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, a)
	wait.For(t, 5*time.Second, "a heartbeat error", func() bool { return a.LastError() != nil })
	time.Sleep(100 * time.Millisecond)
	if a.Ready() || a.LastError() == nil {
		t.Fatalf("Ready %v LastError %v; want false and an error", a.Ready(), a.LastError())
	}
	if n, err := a.ReadyReplicas(context.Background()); n != 1 || err == nil {
		t.Fatalf("ReadyReplicas = %d, %v; want 1 and an error", n, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v when its context ended, want nil", err)
	}
	if !strings.Contains(logged.String(), "could not remove this replica's row") {
		t.Errorf("no log line for the row left behind: %q", logged.String())
	}
	if got := strings.Count(logged.String(), "heartbeat failed"); got != 1 {
		t.Errorf("%d lines say the heartbeat failed, want 1 (once when heartbeats start failing): %q", got, logged.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReadyNeedsRecentHeartbeat: Ready turns false three intervals after the
// last successful heartbeat, on the injected clock.
func TestReadyNeedsRecentHeartbeat(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	a, err := replica.New(pgtest.Pool(t, url, 1), replica.Options{Name: "a", Interval: time.Hour, Logger: quiet, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	started(t, a)
	advance(3*time.Hour - time.Second)
	if !a.Ready() {
		t.Fatal("not Ready 2h59m59s after a heartbeat with a 1h interval")
	}
	advance(time.Second)
	if a.Ready() {
		t.Fatal("Ready three intervals after the last heartbeat")
	}
	if err := a.Heartbeat(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !a.Ready() {
		t.Fatal("not Ready after a fresh heartbeat")
	}
}

// TestRunTwice: a second Run of one Registry, while the first runs,
// returns ErrStarted at once.
func TestRunTwice(t *testing.T) {
	t.Parallel()
	a := newRegistry(t, pgtest.Pool(t, pgtest.URL(t), 1), "a", time.Second)
	started(t, a)
	if err := a.Run(context.Background()); !errors.Is(err, replica.ErrStarted) {
		t.Fatalf("second Run: %v, want ErrStarted", err)
	}
}

func TestBadOptions(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, tc := range []struct {
		name string
		pool *pgxpool.Pool
		opts replica.Options
		want string
	}{
		{"nil pool", nil, replica.Options{}, "nil pool"},
		{"interval too short", pool, replica.Options{Interval: 5 * time.Millisecond}, "at least 10ms"},
		{"negative interval", pool, replica.Options{Interval: -time.Second}, "at least 10ms"},
		{"negative timeout", pool, replica.Options{Timeout: -time.Second}, "negative timeout"},
		{"blank name", pool, replica.Options{Name: " a "}, "blank"},
		{"long name", pool, replica.Options{Name: strings.Repeat("x", 201)}, "longer than 200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := replica.New(tc.pool, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) || r != nil {
				t.Fatalf("New = %v, %v; want an error containing %q", r, err, tc.want)
			}
		})
	}
	r, err := replica.New(pool, replica.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Interval() != replica.DefaultInterval || r.Name() == "" {
		t.Fatalf("defaults: interval %v name %q", r.Interval(), r.Name())
	}
}

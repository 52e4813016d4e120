package nodelimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
	"github.com/pglimit/pglimit/nodelimit"
	"github.com/pglimit/pglimit/replica"
)

func TestMain(m *testing.M) {
	if starvedChild != nil {
		starvedChild() // this binary is a child process of a test
	}
	pgtest.MainWithExampleDatabase(m)
}

// starvedChild, when set, is what this test binary runs instead of the
// tests: a child process of TestStarvedReplicaKeepsToItsShare.
var starvedChild func()

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fixedReady answers n (or an error) as Options.Replicas and counts its
// reads.
type fixedReady struct {
	n     atomic.Int64
	fail  atomic.Bool
	reads atomic.Int64
}

func newFixed(n int) *fixedReady {
	f := &fixedReady{}
	f.n.Store(int64(n))
	return f
}

func (f *fixedReady) ReadyReplicas(context.Context) (int, error) {
	f.reads.Add(1)
	if f.fail.Load() {
		return 1, errors.New("database down")
	}
	return int(f.n.Load()), nil
}

func newLimiter(t testing.TB, opts nodelimit.Options) *nodelimit.Limiter {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	l, err := nodelimit.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	stops.Store(l, stop)
	t.Cleanup(stop)
	return l
}

// stops holds the function that ends each test limiter's Run.
var stops sync.Map

// stopRun ends l's Run and waits for it.
func stopRun(l *nodelimit.Limiter) {
	stop, _ := stops.Load(l)
	stop.(func())()
}

// runRegistry runs reg in the background until the returned stop is
// called or the test ends; a first heartbeat is written before it returns.
func runRegistry(t testing.TB, reg *replica.Registry) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("registry Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	for deadline := time.Now().Add(10 * time.Second); !reg.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the registry's first heartbeat did not succeed within 10 s")
		}
	}
	return stop
}

func nodeOf(t testing.TB, l *nodelimit.Limiter, name string) *nodelimit.Node {
	t.Helper()
	n, err := l.Node(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// countingNode stands in for an upstream node: it answers every POST and
// records when each arrived, the observer of the rate the node sees. (The
// reference service's Jolokia client and its fake broker node are tested
// against this limiter in cmd/.)
type countingNode struct {
	mu    sync.Mutex
	calls []time.Time
}

func (n *countingNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n.mu.Lock()
	n.calls = append(n.calls, time.Now())
	n.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{}`)
}

// Calls returns the arrival times, in order.
func (n *countingNode) Calls() []time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.calls)
}

func newFakeNode(t testing.TB) (*countingNode, *httptest.Server) {
	t.Helper()
	fn := &countingNode{}
	srv := httptest.NewServer(fn)
	t.Cleanup(srv.Close)
	return fn, srv
}

// client calls a node through its limiter: a turn, then one HTTP POST.
type client struct {
	url  string
	node *nodelimit.Node
}

func (c *client) call(ctx context.Context) error {
	if err := c.node.Wait(ctx); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(`{}`))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// rep is one stand-in replica: its own pool, registry, limiter and client
// of the shared fake node.
type rep struct {
	pool   *pgxpool.Pool
	reg    *replica.Registry
	stop   func() // ends the registry's Run
	lim    *nodelimit.Limiter
	node   *nodelimit.Node
	client *client
}

// startReplicas starts n replicas on the database at url, each registered
// (heartbeat every interval) and limiting calls to the node at nodeURL to
// its share of total, re-reading the ready count every refresh.
func startReplicas(t *testing.T, url string, n int, total rate.Limit, nodeURL string, interval, refresh time.Duration) []*rep {
	t.Helper()
	ctx := context.Background()
	reps := make([]*rep, n)
	for i := range reps {
		pool := pgtest.Pool(t, url, 2)
		reg, err := replica.New(pool, replica.Options{Name: fmt.Sprintf("r%d", i), Interval: interval, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		stop := runRegistry(t, reg)
		lim := newLimiter(t, nodelimit.Options{Rate: total, Replicas: reg.ReadyReplicas, Refresh: refresh})
		node := nodeOf(t, lim, "fake")
		client := &client{url: nodeURL, node: node}
		reps[i] = &rep{pool: pool, reg: reg, stop: stop, lim: lim, node: node, client: client}
	}
	for _, r := range reps {
		if err := r.lim.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return reps
}

// TestThreeReplicasKeepToTheNodeRate: three replicas registered on one
// database share a node rate of 6: each takes 2 per second, and the node,
// counting what it receives from all three under full load, sees no more
// than 6 in any second once the first burst is past.
func TestThreeReplicasKeepToTheNodeRate(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	fn, srv := newFakeNode(t)
	// Heartbeats every second: a row lives three intervals, so a heartbeat
	// a loaded machine delays does not let a replica's row lapse and move
	// the shares mid-run.
	reps := startReplicas(t, url, 3, 6, srv.URL, time.Second, 100*time.Millisecond)
	for i, r := range reps {
		if nodelimit.ReadyReplicas(r.lim) != 3 || r.node.Limit() != 2 || nodelimit.Burst(r.node) != 2 {
			t.Fatalf("replica %d: ready %d, limit %v, burst %d; want 3, 2/s, 2", i, nodelimit.ReadyReplicas(r.lim), r.node.Limit(), nodelimit.Burst(r.node))
		}
	}

	// Full load: four workers per replica call as fast as they are let.
	const seconds = 4
	// A context canceled (not a deadline, which makes Wait refuse turns past
	// it at once) when the load ends.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(seconds*time.Second+600*time.Millisecond, cancel)
	var wg sync.WaitGroup
	var unexpected atomic.Value
	for _, r := range reps {
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					if err := r.client.call(ctx); err != nil && ctx.Err() == nil {
						unexpected.Store(err)
					}
				}
			})
		}
	}
	wg.Wait()
	if err := unexpected.Load(); err != nil {
		t.Fatalf("a call failed: %v", err)
	}

	calls := fn.Calls()
	if len(calls) == 0 {
		t.Fatal("the node received nothing")
	}
	// Every replica's bucket starts full (2 calls at once when the load
	// starts, t0) and then lets one call through every 500 ms after t0.
	// Windows of one second starting 250 ms after t0 hold two of each
	// replica's turns, far from their edges.
	t0 := calls[0]
	burst := 0
	for _, at := range calls {
		if at.Before(t0.Add(250 * time.Millisecond)) {
			burst++
		}
	}
	perSecond := make([]int, seconds)
	for _, at := range calls {
		if k := int(at.Sub(t0.Add(250*time.Millisecond)) / time.Second); at.Sub(t0) >= 250*time.Millisecond && k < seconds {
			perSecond[k]++
		}
	}
	t.Logf("first burst %d calls, then per second %v (%d calls in all)", burst, perSecond, len(calls))
	if burst > 6 {
		t.Errorf("first burst: %d calls, want at most 6 (3 buckets of 2)", burst)
	}
	for k, n := range perSecond {
		if n > 6 {
			t.Errorf("second %d: the node received %d calls, more than its rate of 6", k+1, n)
		}
		if n < 5 {
			t.Errorf("second %d: the node received %d calls; the load did not use the share (want 6)", k+1, n)
		}
	}
}

// TestShareFollowsReadyReplicas: when a replica stops heartbeating (its
// database connection is gone) the others raise their share once its row
// has lapsed (three heartbeat intervals after its last one), at their next
// refresh; a replica that stops cleanly frees its share at the next
// refresh. The heartbeat interval is a second: the survivors' rows must not
// lapse on their own when a loaded machine delays a heartbeat (a row lives
// three intervals). The waits below only bound a hang; the order is
// checked against the registry: when the share rises, the database says
// the stopped replica is no longer ready.
func TestShareFollowsReadyReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	_, srv := newFakeNode(t)
	reps := startReplicas(t, url, 3, 6, srv.URL, time.Second, 100*time.Millisecond)
	for _, r := range reps {
		if r.node.Limit() != 2 {
			t.Fatalf("limit %v with 3 ready, want 2", r.node.Limit())
		}
	}

	stopRun(reps[2].lim)
	reps[2].pool.Close() // r2's heartbeats fail from now on; its row lapses
	start := time.Now()
	wait.For(t, time.Minute, "r0 and r1 take 3/s each", func() bool {
		return reps[0].node.Limit() == 3 && reps[1].node.Limit() == 3
	})
	t.Logf("share raised %v after r2 stopped heartbeating", time.Since(start).Round(10*time.Millisecond))
	var r2Ready bool
	if err := reps[0].pool.QueryRow(context.Background(),
		`SELECT coalesce(bool_or(ready AND expires_at > now()), false) FROM pglimit.replica WHERE name = 'r2'`).Scan(&r2Ready); err != nil {
		t.Fatal(err)
	}
	if r2Ready {
		t.Fatal("the share rose while the registry still counts r2 ready")
	}
	if nodelimit.ReadyReplicas(reps[0].lim) != 2 || nodelimit.Burst(reps[0].node) != 3 {
		t.Fatalf("ready %d burst %d, want 2 and 3", nodelimit.ReadyReplicas(reps[0].lim), nodelimit.Burst(reps[0].node))
	}

	reps[1].stop() // a clean shutdown: Run deletes its row
	wait.For(t, time.Minute, "r0 takes the whole rate", func() bool { return reps[0].node.Limit() == 6 })
}

// TestRateBelowReplicas: a rate of 2 with 3 ready replicas gives each
// replica 1 call per second (so the node can see 3: ADR-0196's stated
// consequence). The second call of a replica comes a second after the
// first, which Wait knows at once under a shorter deadline.
func TestRateBelowReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	_, srv := newFakeNode(t)
	reps := startReplicas(t, url, 3, 2, srv.URL, time.Second, time.Second)
	for i, r := range reps {
		if r.node.Limit() != 1 || nodelimit.Burst(r.node) != 1 {
			t.Fatalf("replica %d: limit %v burst %d, want 1/s and 1", i, r.node.Limit(), nodelimit.Burst(r.node))
		}
	}
	n := reps[0].node
	if err := n.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 900*time.Millisecond)
	defer cancel()
	if err := n.Wait(ctx); !errors.Is(err, nodelimit.ErrNoTurn) {
		t.Fatalf("second call within 900 ms: %v, want ErrNoTurn (next turn a second after the first)", err)
	}
	// The other replicas each have their own call this second.
	for _, r := range reps[1:] {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := r.node.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatalf("another replica's first call: %v", err)
		}
	}
}

func TestShare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		total rate.Limit
		ready int
		want  rate.Limit
	}{
		{20, 1, 20}, {20, 3, 7}, {20, 4, 5}, {20, 20, 1}, {20, 40, 1},
		{6, 3, 2}, {6, 2, 3}, {2, 3, 1}, {1, 5, 1}, {7, 0, 7}, {7, -2, 7},
		{rate.Inf, 3, rate.Inf},
	} {
		if got := nodelimit.Share(tc.total, tc.ready); got != tc.want {
			t.Errorf("Share(%v, %d) = %v, want %v", tc.total, tc.ready, got, tc.want)
		}
	}
}

// TestWaitEndsWithContext: a call whose context ends while it waits fails
// at once with ErrNoTurn; a deadline before the turn fails without waiting;
// neither is counted as a call.
func TestWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	meter := observetest.New()
	l := newLimiter(t, nodelimit.Options{Rate: 1, MeterProvider: meter})
	n := nodeOf(t, l, "n")
	if err := n.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	err := n.Wait(ctx)
	waited := time.Since(start)
	var we *nodelimit.WaitError
	if !errors.Is(err, nodelimit.ErrNoTurn) || !errors.Is(err, context.Canceled) || !errors.As(err, &we) || we.Node() != "n" {
		t.Fatalf("canceled while waiting: %v, want a wait error matching ErrNoTurn and context.Canceled", err)
	}
	// Had Wait not seen the cancel it would have returned at the turn, a
	// second after the first; anything well before that saw it (a loaded
	// machine may take a few hundred milliseconds to run the goroutine).
	if waited > 900*time.Millisecond {
		t.Fatalf("canceled after 50 ms but Wait returned after %v (the turn was ~1 s away)", waited)
	}

	ctx, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	start = time.Now()
	err = n.Wait(ctx)
	if !errors.Is(err, nodelimit.ErrNoTurn) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline before the turn: %v, want ErrNoTurn and DeadlineExceeded", err)
	}
	// Waiting for the deadline would take its 300 ms; failing at once
	// takes none of it.
	if waited := time.Since(start); waited >= 300*time.Millisecond {
		t.Fatalf("a deadline before the turn should fail at once; waited %v, the whole deadline", waited)
	}
	if !strings.Contains(err.Error(), `"n"`) {
		t.Fatalf("error text %q does not name the node", err)
	}

	if got := collect(t, meter); got != 1 {
		t.Fatalf("counted %v; want only the call that got its turn", got)
	}
}

// TestTurnsInOrder: calls waiting for their turn get it in the order they
// called Wait, one every 1/share.
func TestTurnsInOrder(t *testing.T) {
	t.Parallel()
	n := nodeOf(t, newLimiter(t, nodelimit.Options{Rate: 5}), "n")
	for range 5 { // the burst
		if err := n.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range 5 {
		wg.Go(func() {
			if err := n.Wait(context.Background()); err != nil {
				t.Error(err)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		})
		// The next calls only once this one is in line (or has gone).
		wait.For(t, 10*time.Second, fmt.Sprintf("call %d in line", i), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return nodelimit.Waiting(n)+len(order) == i+1
		})
	}
	wg.Wait()
	if !slices.Equal(order, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("turns in the order %v, want the order of the calls", order)
	}
}

// TestWaitFollowsARaisedShare: a call waiting for its turn at a share of
// 1/s (its turn a second away) goes as soon as the share is raised (the
// ready replicas fell from 5 to 1: 5/s, a burst of 5), not at the turn
// the old share gave it.
func TestWaitFollowsARaisedShare(t *testing.T) {
	t.Parallel()
	ready := newFixed(5)
	l := newLimiter(t, nodelimit.Options{Rate: 5, Replicas: ready.ReadyReplicas, Refresh: time.Hour})
	n := nodeOf(t, l, "n")
	if err := l.Refresh(context.Background()); err != nil || n.Limit() != 1 {
		t.Fatalf("share %v, %v; want 1/s", n.Limit(), err)
	}
	if err := n.Wait(context.Background()); err != nil { // the burst of 1
		t.Fatal(err)
	}
	done := make(chan time.Time, 1)
	go func() {
		if err := n.Wait(context.Background()); err != nil {
			t.Error(err)
		}
		done <- time.Now()
	}()
	wait.For(t, 10*time.Second, "the call in line", func() bool { return nodelimit.Waiting(n) == 1 })
	ready.n.Store(1)
	raised := time.Now()
	if err := l.Refresh(context.Background()); err != nil || n.Limit() != 5 {
		t.Fatalf("share %v, %v; want 5/s", n.Limit(), err)
	}
	// At the old share the turn was a second after the first call; at the
	// new one a fifth of that, already past or near. Anything well before
	// the old turn followed the new share (a loaded machine may take a few
	// hundred milliseconds to run the goroutine).
	if waited := (<-done).Sub(raised); waited > 700*time.Millisecond {
		t.Fatalf("the call went %v after the share was raised to 5/s; at 1/s its turn was up to a second away", waited)
	}
}

// collect returns pglimit.nodelimit.calls, checking that it carries no
// attribute.
func collect(t *testing.T, meter *observetest.Meter) int64 {
	t.Helper()
	var got int64
	for _, p := range meter.Points() {
		if p.Name != nodelimit.MetricName {
			continue
		}
		if !p.Counter {
			t.Fatalf("%s is a histogram, want an int64 counter", p.Name)
		}
		if p.Attributes.Len() != 0 {
			t.Fatalf("data point attributes %v, want none", p.Attributes.ToSlice())
		}
		got += p.Sum
	}
	return got
}

// TestMetricCountsEveryTurn: every turn taken is counted, on every node,
// in one series without attributes (what the calls are is the caller's to
// count).
func TestMetricCountsEveryTurn(t *testing.T) {
	t.Parallel()
	meter := observetest.New()
	l := newLimiter(t, nodelimit.Options{Rate: rate.Inf, MeterProvider: meter})
	fn, srv := newFakeNode(t)
	c := &client{url: srv.URL, node: nodeOf(t, l, "fake")}
	for range 4 {
		if err := c.call(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(fn.Calls()); n != 4 {
		t.Fatalf("the node received %d calls, want 4", n)
	}
	if got := collect(t, meter); got != 4 {
		t.Fatalf("pglimit.nodelimit.calls = %d, want 4", got)
	}
	if err := nodeOf(t, l, "other").Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, meter); got != 5 {
		t.Fatalf("after a call to another node: %d, want 5", got)
	}
}

// TestNoReadyCountPerCall: calls never read the ready count; only the
// background refresh does.
func TestNoReadyCountPerCall(t *testing.T) {
	t.Parallel()
	ready := newFixed(1)
	l := newLimiter(t, nodelimit.Options{Rate: rate.Inf, Replicas: ready.ReadyReplicas, Refresh: time.Hour})
	// The background goroutine reads once at start, then every hour.
	wait.For(t, 2*time.Second, "the first background read", func() bool { return ready.reads.Load() == 1 })
	before := ready.reads.Load()
	n := nodeOf(t, l, "n")
	for range 10_000 {
		if err := n.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if after := ready.reads.Load(); after != before {
		t.Fatalf("10,000 calls read the ready count %d times, want 0", after-before)
	}
}

// TestRefresh: Run follows the count at its interval, keeps the share in
// use when the count cannot be read, and stops reading when it ends.
func TestRefresh(t *testing.T) {
	t.Parallel()
	ready := newFixed(4)
	l := newLimiter(t, nodelimit.Options{Rate: 20, NodeRates: map[string]rate.Limit{"slow": 3}, Replicas: ready.ReadyReplicas, Refresh: 20 * time.Millisecond})
	fast, slow := nodeOf(t, l, "fast"), nodeOf(t, l, "slow")
	wait.For(t, 2*time.Second, "first refresh", func() bool { return fast.Limit() == 5 })
	if slow.Limit() != 1 || nodelimit.Rate(slow) != 3 || nodelimit.Rate(fast) != 20 {
		t.Fatalf("slow node: limit %v rate %v; fast rate %v", slow.Limit(), nodelimit.Rate(slow), nodelimit.Rate(fast))
	}
	ready.n.Store(2)
	wait.For(t, 2*time.Second, "share follows 2 ready", func() bool { return fast.Limit() == 10 && slow.Limit() == 2 })
	ready.fail.Store(true)
	ready.n.Store(1)
	reads := ready.reads.Load()
	wait.For(t, 2*time.Second, "failed reads", func() bool { return ready.reads.Load() >= reads+3 })
	if fast.Limit() != 10 || nodelimit.ReadyReplicas(l) != 2 {
		t.Fatalf("after failed reads: limit %v ready %d; want the last good share (10, 2)", fast.Limit(), nodelimit.ReadyReplicas(l))
	}
	if err := l.Refresh(context.Background()); err == nil {
		t.Fatal("Refresh hid the counter's error")
	}
	ready.fail.Store(false)
	wait.For(t, 2*time.Second, "recovered", func() bool { return fast.Limit() == 20 })
	if late := nodeOf(t, l, "late"); late.Limit() != 20 {
		t.Fatalf("a node made after the refresh has limit %v, want 20", late.Limit())
	}
	if again := nodeOf(t, l, "fast"); again != fast {
		t.Fatal("Node returned a second limiter for one node")
	}
	if err := l.Run(context.Background()); !errors.Is(err, nodelimit.ErrRunTwice) {
		t.Fatalf("second Run: %v, want ErrRunTwice", err)
	}
	stopRun(l)
	reads = ready.reads.Load()
	time.Sleep(100 * time.Millisecond)
	if ready.reads.Load() != reads {
		t.Fatal("reads after Run ended")
	}
	if fast.Limit() != 20 {
		t.Fatalf("after Run ended: limit %v, want the last share (20)", fast.Limit())
	}
}

func TestBadOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts nodelimit.Options
		want string
	}{
		{"negative rate", nodelimit.Options{Rate: -1}, "whole number"},
		{"fraction", nodelimit.Options{Rate: 0.5}, "whole number"},
		{"not whole", nodelimit.Options{Rate: 2.5}, "whole number"},
		{"NaN", nodelimit.Options{Rate: rate.Limit(math.NaN())}, "not a number"},
		{"+Inf", nodelimit.Options{Rate: rate.Limit(math.Inf(1))}, "rate.Inf"},
		{"-Inf", nodelimit.Options{Rate: rate.Limit(math.Inf(-1))}, "rate.Inf"},
		{"too high", nodelimit.Options{Rate: 2_000_000}, "from 1 to"},
		{"bad node rate", nodelimit.Options{NodeRates: map[string]rate.Limit{"b1": -3}}, `node "b1"`},
		{"zero node rate", nodelimit.Options{NodeRates: map[string]rate.Limit{"b1": 0}}, `node "b1"`},
		{"empty node name", nodelimit.Options{NodeRates: map[string]rate.Limit{"": 5}}, "empty name"},
		{"negative refresh", nodelimit.Options{Refresh: -time.Second}, "negative refresh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := nodelimit.New(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) || l != nil {
				t.Fatalf("New = %v, %v; want an error containing %q", l, err, tc.want)
			}
		})
	}
	l := newLimiter(t, nodelimit.Options{})
	if _, err := l.Node(""); err == nil {
		t.Fatal("Node(\"\"): no error")
	}
	n := nodeOf(t, l, "n")
	if nodelimit.Rate(n) != nodelimit.DefaultRate || n.Limit() != 20 || nodelimit.Burst(n) != 20 || nodelimit.ReadyReplicas(l) != 1 {
		t.Fatalf("defaults: rate %v limit %v burst %d ready %d", nodelimit.Rate(n), n.Limit(), nodelimit.Burst(n), nodelimit.ReadyReplicas(l))
	}
}

// BenchmarkWait measures the limiter's own cost per call with an unlimited
// rate, beside a plain rate.Limiter in the same run. The limiter reads the
// ready count from a real registry in the background; the benchmark fails
// if any call reads it.
func BenchmarkWait(b *testing.B) {
	url := pgtest.URL(b)
	pool := pgtest.Pool(b, url, 2)
	reg, err := replica.New(pool, replica.Options{Name: "bench", Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	runRegistry(b, reg)
	ready := &countingReady{inner: reg.ReadyReplicas}
	noop := newLimiter(b, nodelimit.Options{Rate: rate.Inf, Replicas: ready.ReadyReplicas, Refresh: time.Hour})
	sdk := newLimiter(b, nodelimit.Options{Rate: rate.Inf, Replicas: ready.ReadyReplicas, Refresh: time.Hour,
		MeterProvider: observetest.New()})
	for ready.reads.Load() < 2 { // the first background read of each
		time.Sleep(time.Millisecond)
	}
	before := ready.reads.Load()

	run := func(name string, call func() error) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	nNoop, nSDK := nodeOf(b, noop, "n"), nodeOf(b, sdk, "n")
	run("Node.Wait/inf/global-meter", func() error { return nNoop.Wait(ctx) })
	run("Node.Wait/inf/sdk-meter", func() error { return nSDK.Wait(ctx) })
	plain := rate.NewLimiter(rate.Inf, 1)
	run("baseline/rate.Limiter.Allow/inf", func() error {
		if !plain.Allow() {
			return errors.New("refused")
		}
		return nil
	})
	run("baseline/rate.Limiter.Wait/inf", func() error { return plain.Wait(ctx) })
	// What a database round trip per call (the rejected alternative) costs.
	run("avoided/db.SessionPing", func() error { return db.New().SessionPing(ctx, pool) })
	if after := ready.reads.Load(); after != before {
		b.Fatalf("calls read the ready count %d times", after-before)
	}
}

type countingReady struct {
	inner func(context.Context) (int, error)
	reads atomic.Int64
}

func (c *countingReady) ReadyReplicas(ctx context.Context) (int, error) {
	c.reads.Add(1)
	return c.inner(ctx)
}

// TestNewStartsNothing: New reads nothing; only Run (or Refresh) reads the
// ready count.
func TestNewStartsNothing(t *testing.T) {
	t.Parallel()
	ready := newFixed(4)
	l, err := nodelimit.New(nodelimit.Options{Rate: 20, Replicas: ready.ReadyReplicas, Refresh: time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := ready.reads.Load(); n != 0 || nodelimit.ReadyReplicas(l) != 1 {
		t.Fatalf("after New: %d reads, ready %d; want none and 1", n, nodelimit.ReadyReplicas(l))
	}
	if err := l.Refresh(context.Background()); err != nil || nodelimit.ReadyReplicas(l) != 4 {
		t.Fatalf("Refresh: %v, ready %d", err, nodelimit.ReadyReplicas(l))
	}
}

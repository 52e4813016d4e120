package inflight_test

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/inflight"
)

// shareReplica is one replica of the shares tests: its pool, Limiter and
// handler, and whether it was killed.
type shareReplica struct {
	pool  *pgxpool.Pool
	l     *inflight.Limiter
	h     http.Handler
	meter *observetest.Meter
	dead  atomic.Bool
}

// observed is the handler behind every replica: it holds each request for
// its token's hold and counts, per token, the requests running at once,
// an observer independent of pglimit's tables.
type observed struct {
	mu      sync.Mutex
	running map[string]int
	peak    map[string]int
	hold    func(token string) time.Duration
}

func (o *observed) ServeHTTP(_ http.ResponseWriter, r *http.Request) {
	tok := r.Header.Get("Authorization")
	o.mu.Lock()
	o.running[tok]++
	if o.running[tok] > o.peak[tok] {
		o.peak[tok] = o.running[tok]
	}
	o.mu.Unlock()
	time.Sleep(o.hold(tok))
	o.mu.Lock()
	o.running[tok]--
	o.mu.Unlock()
}

func newShareReplica(t *testing.T, url string, o *observed) *shareReplica {
	t.Helper()
	r := &shareReplica{pool: pgtest.Pool(t, url, 16), meter: observetest.New()}
	pgtest.Listen(t, r.pool)
	l, err := inflight.NewWithGrace(r.pool, inflight.Options{Key: tokenID, Limit: 8, MaxDuration: 2 * time.Second,
		Logger: quiet, MeterProvider: r.meter}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A lease of 2 s; a new holder runs nothing on its share for the
	// slots' lease (3 s) and the claimers' list's age (5 s).
	inflight.SetShareLease(l, 2*time.Second, 8*time.Second)
	r.l, r.h = l, l.Handler(o)
	return r
}

// TestSharedSlotsHoldTheCap: four replicas (four pools on one database,
// each with its bus), tokens with a cap of 8 and 4 shares, three loads at
// once for 12 s:
//
//   - 100 cold tokens, each one request at a time, a few a second, round
//     robin over the replicas;
//   - a token at 90 % of its cap on one replica: 7 loops back to back;
//   - a token at 150 % over every replica: 12 loops.
//
// Half way one replica is killed (its share never given back) and a fifth
// joins. Judged by the handler's own count of each token's requests
// running at once, across every replica: the 150 % token never has more
// than 8 running; the 90 % token is never refused (it gets the shares
// given up when the database's part of its cap is full); no cold request
// is refused; and by the replicas' own counts most cold requests ran on a
// share, with no statement.
func TestSharedSlotsHoldTheCap(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	o := &observed{running: map[string]int{}, peak: map[string]int{}, hold: func(tok string) time.Duration {
		if tok == "Bearer hot" || tok == "Bearer steady" {
			return 20 * time.Millisecond
		}
		return 5 * time.Millisecond
	}}
	var rs []*shareReplica
	for range 4 {
		rs = append(rs, newShareReplica(t, url, o))
	}
	deadline := time.Now().Add(time.Minute)
	for {
		n := 0
		for _, r := range rs {
			if inflight.Spending(r.l) {
				n++
			}
		}
		if n == len(rs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d replicas hold a share they may run requests on after a minute", n, len(rs))
		}
		time.Sleep(50 * time.Millisecond)
	}

	var (
		replicas     atomic.Pointer[[]*shareReplica]
		wg           sync.WaitGroup
		refused      sync.Map // token -> *atomic.Int64
		requests     sync.Map
		statusErrors atomic.Int64
		coldTotal    atomic.Int64
	)
	replicas.Store(&rs)
	count := func(m *sync.Map, tok string) {
		v, _ := m.LoadOrStore(tok, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	live := func() []*shareReplica {
		var out []*shareReplica
		for _, r := range *replicas.Load() {
			if !r.dead.Load() {
				out = append(out, r)
			}
		}
		return out
	}
	send := func(r *shareReplica, tok string) {
		got := call(t, r.h, tok)
		count(&requests, tok)
		switch got.status {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			count(&refused, tok)
		default:
			if r.dead.Load() {
				return // its replica was killed under it: a dead replica's request fails
			}
			statusErrors.Add(1)
		}
	}
	const run = 12 * time.Second
	stop := time.Now().Add(run)
	for k := range 100 {
		wg.Go(func() {
			tok := fmt.Sprintf("cold-%03d", k)
			time.Sleep(time.Duration(k) * 5 * time.Millisecond)
			for n := k; time.Now().Before(stop); n++ {
				rs := live()
				send(rs[n%len(rs)], tok)
				coldTotal.Add(1)
				time.Sleep(400 * time.Millisecond)
			}
		})
	}
	for range 7 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				send(rs[1], "steady")
			}
		})
	}
	for w := range 12 {
		wg.Go(func() {
			for n := w; time.Now().Before(stop); n++ {
				rs := live()
				send(rs[n%len(rs)], "hot")
			}
		})
	}
	time.Sleep(run / 2)
	rs[0].dead.Store(true)
	inflight.Kill(rs[0].l)
	joined := newShareReplica(t, url, o)
	all := append(slices.Clone(rs), joined)
	replicas.Store(&all)
	wg.Wait()

	get := func(m *sync.Map, tok string) int64 {
		if v, ok := m.Load(tok); ok {
			return v.(*atomic.Int64).Load()
		}
		return 0
	}
	var coldRefused int64
	refused.Range(func(k, v any) bool {
		if s := k.(string); len(s) > 5 && s[:5] == "cold-" {
			coldRefused += v.(*atomic.Int64).Load()
		}
		return true
	})
	var memory, statements int64
	for _, r := range all {
		for k, n := range r.meter.Counts(t, "pglimit.decisions", "outcome", "source") {
			switch k {
			case "granted memory":
				memory += n
			case "granted ", "granted":
				statements += n
			}
		}
	}
	o.mu.Lock()
	hotPeak, steadyPeak := o.peak["Bearer hot"], o.peak["Bearer steady"]
	o.mu.Unlock()
	t.Logf("the hot token: %d requests, %d refused, at most %d running at once (cap 8); the steady token (7 loops, one replica): %d requests, %d refused, at most %d running; cold tokens: %d requests, %d refused; run on a share %d, claimed in the database %d",
		get(&requests, "hot"), get(&refused, "hot"), hotPeak, get(&requests, "steady"), get(&refused, "steady"), steadyPeak,
		coldTotal.Load(), coldRefused, memory, statements)
	if n := statusErrors.Load(); n > 0 {
		t.Errorf("%d requests answered neither 200 nor 429", n)
	}
	if hotPeak > 8 {
		t.Errorf("the hot token had %d requests running at once, above its cap of 8", hotPeak)
	}
	if n := get(&refused, "steady"); n > 0 {
		t.Errorf("the steady token (7 of 8 on one replica) was refused %d times", n)
	}
	if coldRefused > 0 {
		t.Errorf("cold tokens were refused %d times", coldRefused)
	}
	if memory < coldTotal.Load()*7/10 {
		t.Errorf("%d requests ran on a share, of %d cold ones: the shares are not used", memory, coldTotal.Load())
	}
}

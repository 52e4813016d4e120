package inflight_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/inflight"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// slotStatements counts the statements a pool sends on the slot table,
// and of those the claims and the renewals, and keeps when each renewal
// was sent and when its answer came.
type slotStatements struct {
	n, claims, renewals atomic.Int64

	mu    sync.Mutex
	spans []span // the renewals, in the order they were sent
}

// span is when a statement was sent and when its answer came (zero while
// it has not).
type span struct{ sent, answered time.Time }

type renewalKey struct{}

func (s *slotStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pglimit.slot") {
		s.n.Add(1)
	}
	if strings.Contains(d.SQL, "INSERT INTO pglimit.slot ") {
		s.claims.Add(1)
	}
	if strings.Contains(d.SQL, "SlotRenew") {
		s.renewals.Add(1)
		s.mu.Lock()
		s.spans = append(s.spans, span{sent: time.Now()})
		i := len(s.spans) - 1
		s.mu.Unlock()
		return context.WithValue(ctx, renewalKey{}, i)
	}
	return ctx
}

func (s *slotStatements) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if i, ok := ctx.Value(renewalKey{}).(int); ok {
		s.mu.Lock()
		s.spans[i].answered = time.Now()
		s.mu.Unlock()
	}
}

// renewalSpans returns the renewals sent so far.
func (s *slotStatements) renewalSpans() []span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.spans)
}

// tracedPool is pgtest.Pool with a statement counter.
func tracedPool(t testing.TB, url string, maxConns int32) (*pgxpool.Pool, *slotStatements) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	st := &slotStatements{}
	cfg.ConnConfig.Tracer = st
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, st
}

// counted is a handler that counts itself running per token, an observer
// independent of the limiter, and keeps the peak.
type counted struct {
	running atomic.Int64
	peak    peak
	hold    time.Duration
}

func (c *counted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.peak.see(c.running.Add(1))
	time.Sleep(c.hold)
	c.running.Add(-1)
	w.WriteHeader(http.StatusOK)
}

// TestKeptCapHoldsAcrossReplicas is TestCapHoldsAcrossReplicas with Keep:
// bursts of one token's requests over three replicas that keep their
// slots. The handlers counting themselves and a separate connection
// counting the token's rows never see more than the limit, and the kept
// rows are rows: the row peak reaches the limit while requests are
// refused.
func TestKeptCapHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	const limit = 3
	work := &counted{hold: 30 * time.Millisecond}
	var (
		servers []*httptest.Server
		pools   []*pgxpool.Pool
	)
	for i := range 3 {
		pool := pgtest.Pool(t, url, 8)
		pools = append(pools, pool)
		l := newLimiter(t, pool, inflight.Options{Limit: limit, Keep: 500 * time.Millisecond, Replica: fmt.Sprint("r", i), Logger: quiet})
		srv := httptest.NewServer(l.Handler(work))
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
	}
	pgtest.Listen(t, pools...)
	rowPeak, stop := rowObserver(t, url, inflight.Scope("id-of-kept-token"))
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
	)
	for round := range 8 {
		var wg sync.WaitGroup
		for i := range 24 {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, servers[(i+round)%3].URL+"/api/audit", nil)
				req.Header.Set("Authorization", "Bearer kept-token")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				got := decode(t, res)
				mu.Lock()
				statuses[got.status]++
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	stop()
	t.Logf("statuses %v; peak running in handlers %d, peak rows %d", statuses, work.peak.v.Load(), rowPeak.v.Load())
	if statuses[200]+statuses[429] != 8*24 {
		t.Fatalf("statuses %v", statuses)
	}
	if h, r := work.peak.v.Load(), rowPeak.v.Load(); h > limit || r > limit {
		t.Fatalf("peak in handlers %d, peak rows %d: above the limit %d", h, r, limit)
	} else if h < limit || r < limit || statuses[429] == 0 {
		t.Fatalf("the limit was never reached (handlers %d, rows %d, refused %d): the test proves nothing", h, r, statuses[429])
	}
}

// TestKeptSteadyClient: one client sending one request after another to
// one replica costs at most 0.05 statements on the slot table per
// request with Keep (its first claim, and a renewal every few seconds),
// where without Keep it costs two (a claim and a release).
func TestKeptSteadyClient(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	for _, keep := range []time.Duration{0, time.Second} {
		pool, st := tracedPool(t, url, 4)
		pgtest.Listen(t, pool)
		l := newLimiter(t, pool, inflight.Options{Limit: 2, Keep: keep, Logger: quiet})
		h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		const n = 2000
		token := fmt.Sprint("steady-", keep)
		start := time.Now()
		for range n {
			if r := call(t, h, token); r.status != http.StatusOK {
				t.Fatalf("Keep %v: status %d", keep, r.status)
			}
		}
		per := float64(st.n.Load()) / n
		t.Logf("Keep %v: %d requests in %v, %.4f statements on the slot table per request", keep, n, time.Since(start), per)
		switch {
		case keep == 0 && per < 2:
			t.Errorf("without Keep %.3f statements per request, want 2 (the tracer sees nothing?)", per)
		case keep > 0 && per > 0.05:
			t.Errorf("with Keep %.3f statements per request, want at most 0.05", per)
		}
		if keep > 0 {
			// The kept slot is a row while kept, and gone once given back.
			if got := liveRows(t, pool, "id-of-"+token); got != 1 {
				t.Errorf("kept rows %d, want 1", got)
			}
			if err := l.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := liveRows(t, pool, "id-of-"+token); got != 0 {
				t.Errorf("rows after Flush %d, want 0", got)
			}
		}
	}
}

// TestKeptSlotRenewed: a steady client paced over several renewal
// periods keeps one slot: its lease is renewed (one statement every
// margin/2, 375 ms here, every 5 s at the default lease, however many
// requests), never claimed again, and every request runs on a row with at least the lease
// a fresh claim gives (MaxDuration + grace) left, read from a separate
// connection while the handler runs.
func TestKeptSlotRenewed(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool, st := tracedPool(t, url, 4)
	observer := pgtest.Pool(t, url, 1)
	pgtest.Listen(t, pool)
	// A lease of 3 s whose renewal margin (a quarter, 750 ms) a renewal
	// statement meets even on a loaded machine.
	const (
		maxDur = 2 * time.Second
		grace  = time.Second
	)
	l, err := inflight.NewWithGrace(pool, inflight.Options{Key: tokenID, Limit: 1, MaxDuration: maxDur, Keep: time.Second, Logger: quiet}, grace)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Flush(context.Background()) })
	left := newLeaseLeft(t, observer, "id-of-renewed-token")
	h := arrived(l.Handler(left))
	start := time.Now()
	n := 0
	for time.Since(start) < 4*time.Second {
		if r := call(t, h, "renewed-token"); r.status != http.StatusOK {
			t.Fatalf("status %d", r.status)
		}
		n++
		time.Sleep(2 * time.Millisecond)
	}
	shortest := left.shortest()
	t.Logf("%d requests in %v: %d statements on the slot table (%d claims, %d renewals), %.4f per request; shortest lease left while a request ran %v",
		n, time.Since(start), st.n.Load(), st.claims.Load(), st.renewals.Load(), float64(st.n.Load())/float64(n), shortest)
	if c := st.claims.Load(); c != 1 {
		t.Errorf("%d claims, want 1: the kept slot was not renewed in time", c)
	}
	if st.renewals.Load() < 2 {
		t.Errorf("%d renewals over 4 s of a lease of %v", st.renewals.Load(), maxDur+grace)
	}
	// A statement every margin/2 (375 ms here), whatever the requests: the
	// bound is the schedule's, not a share of the requests, which a loaded
	// machine sends fewer of (152 in 4 s beside other tests, 400 alone).
	elapsed := time.Since(start)
	half := (maxDur + grace) / 4 / 2
	if most := 1 + int64(elapsed/half) + 1; st.n.Load() > most {
		t.Errorf("%d statements in %v, want at most %d: one claim and a renewal every %v", st.n.Load(), elapsed, most, half)
	}
	// 20 ms: the clock's rounding and the read's own time.
	if shortest < maxDur+grace-20*time.Millisecond {
		t.Errorf("a request ran on a row with %v of lease left, less than MaxDuration + grace = %v", shortest, maxDur+grace)
	}
}

// leaseLeft is a handler that reads, on every fifth request, how much
// lease the request's row has left, from a connection of its own.
type leaseLeft struct {
	t        *testing.T
	observer *pgxpool.Pool
	key      string
	n        atomic.Int64
	least    atomic.Int64
}

func newLeaseLeft(t *testing.T, observer *pgxpool.Pool, key string) *leaseLeft {
	w := &leaseLeft{t: t, observer: observer, key: key}
	w.least.Store(int64(time.Hour))
	return w
}

// arrivedKey is the context key of when a request reached the Handler.
type arrivedKey struct{}

// arrived stamps each request with when it reached h, before the Limiter
// decided it: leaseLeft judges the lease as it was then.
func arrived(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), arrivedKey{}, time.Now())))
	})
}

func (w *leaseLeft) ServeHTTP(_ http.ResponseWriter, r *http.Request) {
	if w.n.Add(1)%5 != 1 {
		return
	}
	// The lease the Limiter judged is the one left when the request
	// arrived (the floor must be left then), not after a loaded machine
	// scheduled the handler: began is the arrival when stamped.
	began := time.Now()
	if at, ok := r.Context().Value(arrivedKey{}).(time.Time); ok {
		began = at
	}
	var ms int64
	if err := w.observer.QueryRow(context.Background(), `SELECT (extract(epoch FROM expires_at - now()) * 1000)::bigint
		FROM pglimit.request_in_flight WHERE scope = $1 AND expires_at > now()`, inflight.Scope(w.key)).Scan(&ms); err != nil {
		w.t.Error(err)
		return
	}
	// What was left when the request arrived: what is left at the
	// observer's statement, plus the time since (a loaded machine's
	// scheduling is not the lease's fault).
	if d := int64(time.Duration(ms)*time.Millisecond + time.Since(began)); d < w.least.Load() {
		w.least.Store(d)
	}
}

// shortest is the least lease left that a request ran with.
func (w *leaseLeft) shortest() time.Duration { return time.Duration(w.least.Load()) }

// TestKeptSlotRenewedLate: a kept slot whose renewal comes late keeps its
// row. Its renewal statement is made to wait: just after a renewal,
// another connection locks the slot's row until 950 ms after that
// renewal was sent (the next one, due 375 ms after it, waits for the row,
// as on a server too loaded to answer in time), so that from 750 ms the
// row has less than the floor a request needs (MaxDuration + grace, 3 s)
// left by this replica's clock. The steady client's requests meanwhile
// renew it themselves, rather than give it back and claim again: one
// claim in all, and every request ran on a row with at least the floor
// left.
func TestKeptSlotRenewedLate(t *testing.T) {
	if testing.Short() {
		// The race detector's run (make test: -race -short) beside two
		// CPU hogs sent no request in the 200 ms the row was short (506
		// requests in all): the scene it stages did not happen, and the
		// test proved nothing. The plain run of the same make test
		// stages it and passes.
		t.Skip("a scene of 200 ms that the race detector's pace does not hit")
	}
	t.Parallel()
	url := pgtest.URL(t)
	pool, st := tracedPool(t, url, 4)
	observer := pgtest.Pool(t, url, 1)
	locker := pgtest.Pool(t, url, 1)
	pgtest.Listen(t, pool)
	const (
		maxDur = 2 * time.Second
		grace  = time.Second
		// margin is what a kept claim's lease adds to the floor, a quarter
		// of it: renewed when margin/2 old, short of the floor at margin.
		margin = (maxDur + grace) / 4
		// locked is how long after a renewal was sent its row stays locked.
		locked = margin + 200*time.Millisecond
	)
	l, err := inflight.NewWithGrace(pool, inflight.Options{Key: tokenID, Limit: 1, MaxDuration: maxDur, Keep: time.Second, Logger: quiet}, grace)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Flush(context.Background()) })
	left := newLeaseLeft(t, observer, "id-of-late-token")
	h := arrived(l.Handler(left))

	// The locker: just after a renewal's answer, it locks the row, unless
	// another renewal was sent meanwhile (then the next renewal would not
	// wait: it tries again after the next one).
	type lock struct {
		renewed, from, until time.Time
		err                  error
	}
	done := make(chan lock, 1)
	go func() {
		ctx := context.Background()
		seen := 0
		for range 20 {
			var last span
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				spans := st.renewalSpans()
				if k := len(spans); k > seen && !spans[k-1].answered.IsZero() {
					seen, last = k, spans[k-1]
					break
				}
				if time.Now().After(deadline) {
					done <- lock{err: errors.New("no renewal answered within 10 s")}
					return
				}
			}
			tx, err := locker.Begin(ctx)
			if err != nil {
				done <- lock{err: err}
				return
			}
			if _, err := tx.Exec(ctx, `SELECT 1 FROM pglimit.slot WHERE kind = 'request_in_flight' AND scope = $1 FOR UPDATE`,
				inflight.Scope("id-of-late-token")); err != nil {
				_ = tx.Rollback(ctx)
				done <- lock{err: err}
				return
			}
			from := time.Now()
			if len(st.renewalSpans()) > seen {
				_ = tx.Rollback(ctx) // another renewal was sent before the lock: too late
				continue
			}
			time.Sleep(time.Until(last.sent.Add(locked)))
			until := time.Now()
			if err := tx.Commit(ctx); err != nil {
				done <- lock{err: err}
				return
			}
			done <- lock{renewed: last.sent, from: from, until: until}
			return
		}
		done <- lock{err: errors.New("20 times another renewal was sent before the row was locked")}
	}()

	var (
		sent []time.Time // when each request was sent
		lk   lock
	)
	for got := false; ; {
		if !got {
			select {
			case lk = <-done:
				got = true
				if lk.err != nil {
					t.Fatalf("locking the kept slot's row between two renewals: %v", lk.err)
				}
			default:
			}
		}
		if got && time.Since(lk.until) > time.Second {
			break
		}
		sent = append(sent, time.Now())
		if r := call(t, h, "late-token"); r.status != http.StatusOK {
			t.Fatalf("status %d", r.status)
		}
		time.Sleep(2 * time.Millisecond)
	}

	// The renewal that waited for the row, and the requests sent while the
	// row had less than the floor left by this replica's clock.
	var waited []span
	for _, s := range st.renewalSpans() {
		if s.sent.After(lk.from) && s.sent.Before(lk.until) && !s.answered.Before(lk.until) {
			waited = append(waited, s)
		}
	}
	short := 0
	for _, at := range sent {
		if at.After(lk.renewed.Add(margin)) && at.Before(lk.until) {
			short++
		}
	}
	t.Logf("%d requests; a renewal sent, the row locked %v later for %v; %d renewals sent while it was locked; %d requests sent after the row ran short, before it was unlocked; %d claims, %d renewals in all; shortest lease left while a request ran %v",
		len(sent), lk.from.Sub(lk.renewed).Round(time.Millisecond), lk.until.Sub(lk.from).Round(time.Millisecond), len(waited), short,
		st.claims.Load(), st.renewals.Load(), left.shortest())
	if len(waited) == 0 {
		t.Fatal("no renewal waited for the locked row: the test proves nothing")
	}
	if short == 0 {
		t.Fatal("no request was sent while the row was short of the floor: the test proves nothing")
	}
	if c := st.claims.Load(); c != 1 {
		t.Errorf("%d claims, want 1: the kept slot whose renewal came late was given back and claimed again", c)
	}
	if d := left.shortest(); d < maxDur+grace-20*time.Millisecond {
		t.Errorf("a request ran on a row with %v of lease left, less than MaxDuration + grace = %v", d, maxDur+grace)
	}
}

// TestKeptIdleGivenBack: a slot kept idle longer than Keep is given back
// by the sweep, with no request. Three requests of one token run at once
// (each waits in the handler until all three are in), so three slots are
// kept when they end.
func TestKeptIdleGivenBack(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	pgtest.Listen(t, pool)
	const keep = 500 * time.Millisecond
	l := newLimiter(t, pool, inflight.Options{Limit: 4, Keep: keep, Logger: quiet})
	var (
		inside   sync.WaitGroup
		together = make(chan struct{})
	)
	inside.Add(3)
	go func() { inside.Wait(); close(together) }()
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside.Done()
		select {
		case <-together:
		case <-time.After(30 * time.Second):
			t.Error("the three requests were never in the handler at once")
		}
		w.WriteHeader(http.StatusOK)
	}))
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if r := call(t, h, "idle-token"); r.status != http.StatusOK {
				t.Errorf("status %d", r.status)
			}
		})
	}
	wg.Wait()
	ended := time.Now()
	// Read before Keep has passed, the three slots are still kept; a
	// machine too loaded to read in time may see the sweep's work already.
	rows, read := liveRows(t, pool, "id-of-idle-token"), time.Since(ended)
	switch {
	case rows == 3:
	case read < keep:
		t.Fatalf("kept rows %d %v after the requests, want 3", rows, read)
	default:
		t.Logf("kept rows %d, read %v after the requests (past Keep %v): the sweep may have begun", rows, read, keep)
	}
	for liveRows(t, pool, "id-of-idle-token") != 0 {
		if time.Since(ended) > keep+5*time.Second {
			t.Fatalf("idle kept slots still held %v after their requests", time.Since(ended))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if waited := time.Since(ended); waited < keep {
		t.Fatalf("kept slots given back after %v, before Keep %v", waited, keep)
	}
}

// TestKeptMovingToken: a token at its limit moving between two replicas
// that keep their slots — each round its limit of requests at once to one
// replica, the next round to the other — is served: the replica refused
// asks on the bus, the other gives its idle slots back, and the refused
// request claims again. The client never has more than the limit in
// flight, so each refusal it gets is a false one: counted, and bounded.
func TestKeptMovingToken(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	const (
		limit  = 2
		rounds = 40
	)
	work := &counted{hold: 5 * time.Millisecond}
	var (
		hs    []http.Handler
		pools []*pgxpool.Pool
	)
	for i := range 2 {
		pool := pgtest.Pool(t, url, 4)
		pools = append(pools, pool)
		l := newLimiter(t, pool, inflight.Options{Limit: limit, Keep: 5 * time.Second, Replica: fmt.Sprint("r", i), Logger: quiet})
		hs = append(hs, l.Handler(work))
	}
	pgtest.Listen(t, pools...)
	var refused, served atomic.Int64
	var slowest atomic.Int64
	for round := range rounds {
		var wg sync.WaitGroup
		for range limit {
			wg.Go(func() {
				start := time.Now()
				r := call(t, hs[round%2], "moving-token")
				if d := int64(time.Since(start)); d > slowest.Load() {
					slowest.Store(d)
				}
				switch r.status {
				case http.StatusOK:
					served.Add(1)
				case http.StatusTooManyRequests:
					refused.Add(1)
				default:
					t.Errorf("status %d", r.status)
				}
			})
		}
		wg.Wait()
	}
	t.Logf("moving token: %d served, %d refused (false refusals) in %d moves; slowest request %v; peak in handlers %d",
		served.Load(), refused.Load(), rounds-1, time.Duration(slowest.Load()), work.peak.v.Load())
	if p := work.peak.v.Load(); p > limit {
		t.Fatalf("peak in handlers %d above the limit %d", p, limit)
	}
	// The bound: a refusal is false only when the holder's give-back takes
	// longer than the refused request's wait (100 ms); allow a few on a
	// busy machine.
	if n := refused.Load(); n > rounds*limit/20 {
		t.Fatalf("%d false refusals of %d requests, want at most %d", n, rounds*limit, rounds*limit/20)
	}
}

// TestKeptSlotsOfKilledReplicaLapse: a replica killed while it keeps idle
// slots (its pool and bus gone, no release sent) leaves them to lapse at
// the end of their lease, as any slot of a killed replica; other replicas
// claim them after. The grace is shortened (as in TestVanishedHolderLapses).
func TestKeptSlotsOfKilledReplicaLapse(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	const (
		limit  = 2
		maxDur = 300 * time.Millisecond
		grace  = 400 * time.Millisecond
		// The lease of a kept claim: MaxDuration + grace + a quarter of
		// that (the margin kept for renewals, at most 10 s).
		lease = (maxDur + grace) * 5 / 4
	)
	dying := pgtest.Pool(t, url, 2)
	alive := pgtest.Pool(t, url, 2)
	busCtx, stopBus := context.WithCancel(context.Background())
	busDone := make(chan struct{})
	go func() { defer close(busDone); _ = bus.Run(busCtx, dying, quiet) }()
	t.Cleanup(func() { stopBus(); <-busDone })
	pgtest.Listen(t, alive)
	for !bus.For(dying).Live() {
		time.Sleep(5 * time.Millisecond)
	}
	opts := inflight.Options{Key: tokenID, Limit: limit, MaxDuration: maxDur, Keep: time.Minute, Logger: quiet}
	dl, err := inflight.NewWithGrace(dying, opts, grace)
	if err != nil {
		t.Fatal(err)
	}
	al, err := inflight.NewWithGrace(alive, opts, grace)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	dh := dl.Handler(&counted{hold: 20 * time.Millisecond})
	claimed := time.Now()
	for range limit {
		wg.Go(func() {
			if r := call(t, dh, "killed-token"); r.status != http.StatusOK {
				t.Errorf("status %d", r.status)
			}
		})
	}
	wg.Wait()
	if got := liveRows(t, alive, "id-of-killed-token"); got != limit {
		t.Fatalf("kept rows %d, want %d", got, limit)
	}
	// Killed: from here no statement of the dying replica reaches the
	// database. Its pool closes first (Close refuses every later Acquire
	// at once, then waits for the connections in use), then its bus
	// stops: a sweep that sees the bus gone gives its idle slots back,
	// and must find no connection to send it on. (With the bus stopped
	// first, a loaded machine let that give-back land before the pool
	// closed: the slots were free after 235 ms.)
	closed := make(chan struct{})
	go func() { defer close(closed); dying.Close() }()
	for {
		c, err := dying.Acquire(context.Background())
		if err != nil {
			break // closing
		}
		c.Release()
		time.Sleep(time.Millisecond)
	}
	stopBus()
	<-busDone
	<-closed
	// Until the kept slots lapse the other replica is refused; the first
	// answer may already be a 200 when the machine took the lease's whole
	// time to get here (beside two CPU hogs it did): the bound below
	// still fails a slot freed before MaxDuration + grace.
	ah := al.Handler(&counted{})
	for {
		got := call(t, ah, "killed-token")
		if got.status == http.StatusOK {
			break
		}
		checkRefusal(t, got, limit, 1)
		if time.Since(claimed) > lease+3*time.Second {
			t.Fatalf("kept slots still held %v after their claim", time.Since(claimed))
		}
		time.Sleep(20 * time.Millisecond)
	}
	waited := time.Since(claimed)
	t.Logf("the killed replica's kept slots lapsed %v after their claim (lease %v)", waited, lease)
	if waited < maxDur+grace-100*time.Millisecond {
		t.Fatalf("slots free after %v, before MaxDuration + grace = %v", waited, maxDur+grace)
	}
}

// TestKeptReleaseTwice: a permit released twice keeps its slot once, so
// two later requests never share one row; past the limit a request is
// refused (after its give-back wait, which no replica answers).
func TestKeptReleaseTwice(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	pgtest.Listen(t, pool)
	ctx := context.Background()
	l := newLimiter(t, pool, inflight.Options{Limit: 2, Keep: time.Minute, Logger: quiet})
	p, err := l.Acquire(ctx, "twice")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var held []*limit.Permit
	for range 2 {
		p, err := l.Acquire(ctx, "twice")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	if got := liveRows(t, pool, "twice"); got != 2 {
		t.Fatalf("two permits on %d rows, want 2", got)
	}
	start := time.Now()
	if _, err := l.Acquire(ctx, "twice"); !errors.Is(err, pglimit.ErrLimited) {
		t.Fatalf("third permit: %v, want a refusal", err)
	}
	t.Logf("refused after %v", time.Since(start))
	for _, p := range held {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := liveRows(t, pool, "twice"); got != 2 {
		t.Fatalf("kept rows %d, want 2", got)
	}
}

// TestKeptNothingWithoutBus: a replica whose invalidation bus is not Live
// (pglimit.Run not running, or a pooler that passes no notifications)
// could not hear another replica ask for its idle slots, so with Keep it
// keeps none: each request claims and releases, as without Keep.
func TestKeptNothingWithoutBus(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool, st := tracedPool(t, url, 2)
	l := newLimiter(t, pool, inflight.Options{Limit: 1, Keep: time.Minute, Logger: quiet})
	h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 10 {
		if r := call(t, h, "no-bus"); r.status != http.StatusOK {
			t.Fatalf("status %d", r.status)
		}
	}
	if got := liveRows(t, pool, "id-of-no-bus"); got != 0 {
		t.Fatalf("%d rows kept without a bus", got)
	}
	if n := st.n.Load(); n != 20 {
		t.Fatalf("%d statements for 10 requests, want 20 (a claim and a release each)", n)
	}
}

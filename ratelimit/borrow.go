package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/memo"
	"github.com/pglimit/pglimit/internal/observe"
)

// Borrowing (Options.Borrow). A key this replica decides at least
// hotRequests times a second borrows a batch of its policy's units in one
// statement (APIRequestWindowBorrow) and spends them in memory. The
// database spends the batch when it is borrowed: the key's TAT moves from
// base to base + n×T, so the batch is the GCRA's positions base+T ...
// base+n×T, which no other decision gets. A unit at position p may be spent
// only while the database clock is at most p − T — exactly when a decision
// in the database at that moment could have given it — so every replica's
// admissions together stay within Burst + Limit × L / Window in every
// interval of length L, borrowed or not. The replica's clock is mapped to
// the database's from above (the decision's time plus the time since the
// statement was sent), so a unit is never spent late.
const (
	// borrowSpan is the stretch of the policy's time a batch asks for:
	// about one second of units at the policy's full rate (the database
	// gives at most a share of what is free, see the statement).
	borrowSpan = time.Second
	// hotRequests is how many decisions of a key in one second (the
	// current or the last) make it hot; cooler keys are decided in the
	// database one request at a time.
	hotRequests = 10
	// quietAfter is how long a batch may go unused before its units are
	// given back.
	quietAfter = 250 * time.Millisecond
)

// Metric names of borrowing, in units, with the attribute limit.
const (
	metricBorrowed = "pglimit.ratelimit.borrowed"
	metricSpent    = "pglimit.ratelimit.spent"
	metricReturned = "pglimit.ratelimit.returned"
	metricStranded = "pglimit.ratelimit.stranded"
)

type borrower struct {
	l      *Limiter
	seed   maphash.Seed
	shards [memo.Shards]keyShard

	borrowed, spent, returned, stranded metric.Int64Counter
	attrs                               metric.AddOption

	giving sync.WaitGroup // give-backs in flight
}

type keyShard struct {
	mu sync.Mutex
	m  map[string]*hotKey
}

// hotKey is what the replica knows of a key it decides often.
type hotKey struct {
	mu sync.Mutex
	// second is the start of the current second of counting; count the
	// key's decisions in it, last those of the second before.
	second      time.Time
	count, last int
	b           *batch
	// pending is closed when the borrow in flight ends; nil when none is.
	pending chan struct{}
}

// batch is a borrowed stretch of one policy's positions, in microseconds on
// the database clock.
type batch struct {
	key    string
	policy Policy
	t      int64 // the policy's T
	clock  clock // the borrow's statement
	next   int64 // the lowest position not spent
	end    int64 // the highest position of the batch: the key's TAT after the borrow
	units  int
	spent  int
	used   time.Time // last spend, this replica's clock
	timer  *time.Timer
}

func newBorrower(l *Limiter, mp metric.MeterProvider) (*borrower, error) {
	b := &borrower{l: l, seed: maphash.MakeSeed(),
		attrs: metric.WithAttributeSet(attribute.NewSet(attribute.String("limit", l.name)))}
	for i := range b.shards {
		b.shards[i].m = map[string]*hotKey{}
	}
	meter := mp.Meter(meterName)
	for _, c := range []struct {
		dst  *metric.Int64Counter
		name string
		desc string
	}{
		{&b.borrowed, metricBorrowed, "Units of a rate policy borrowed for spending in memory."},
		{&b.spent, metricSpent, "Borrowed units spent in memory (the request that borrowed a batch included)."},
		{&b.returned, metricReturned, "Borrowed units given back unspent."},
		{&b.stranded, metricStranded, "Borrowed units neither spent nor given back: they lapsed."},
	} {
		var err error
		if *c.dst, err = meter.Int64Counter(c.name, metric.WithDescription(c.desc), metric.WithUnit("{unit}")); err != nil {
			return nil, fmt.Errorf("ratelimit: metric: %w", err)
		}
	}
	return b, nil
}

// hot returns key's entry, counting this decision, or nil when the table
// is full.
func (bw *borrower) hot(key string, now time.Time) *hotKey {
	sh := &bw.shards[maphash.String(bw.seed, key)%memo.Shards]
	sh.mu.Lock()
	hk := sh.m[key]
	if hk == nil {
		if len(sh.m) >= memo.Keys/memo.Shards {
			for k, old := range sh.m {
				if old.idle(now) {
					delete(sh.m, k)
				}
			}
			if len(sh.m) >= memo.Keys/memo.Shards {
				sh.mu.Unlock()
				return nil
			}
		}
		hk = &hotKey{second: now}
		sh.m[key] = hk
	}
	sh.mu.Unlock()
	return hk
}

// idle reports whether hk may be forgotten: no batch, no borrow, no
// decision for two seconds.
func (hk *hotKey) idle(now time.Time) bool {
	if !hk.mu.TryLock() {
		return false
	}
	defer hk.mu.Unlock()
	return hk.b == nil && hk.pending == nil && now.Sub(hk.second) > 2*time.Second
}

// tick counts a decision; hk.mu is held. It reports whether the key is hot.
func (hk *hotKey) tick(now time.Time) bool {
	if d := now.Sub(hk.second); d >= time.Second {
		hk.last = hk.count
		if d >= 2*time.Second {
			hk.last = 0
		}
		hk.second, hk.count = now, 0
	}
	hk.count++
	return hk.count >= hotRequests || hk.last >= hotRequests
}

// spend takes cost units of b at now; hk.mu is held. A unit is spent only
// while the database's time, from above, is at most its position − T.
func (b *batch) spend(cost int, now time.Time) bool {
	at := b.clock.above(now).UnixMicro()
	p := max(b.next, at+b.t)
	last := p + int64(cost-1)*b.t
	if last > b.end {
		return false
	}
	b.next = last + b.t
	b.spent += cost
	b.used = now
	return true
}

// left is the units of b still spendable at database time at.
func (b *batch) left(at int64) int64 {
	start := max(b.next, at+b.t)
	if start > b.end {
		return 0
	}
	return (b.end-start)/b.t + 1
}

// acquire decides a request of cost under the one policy p by borrowing;
// done false sends it to the database as without borrowing (a cool key, a
// full table, a key whose row holds other policies).
func (bw *borrower) acquire(ctx context.Context, key string, cost int, p Policy, policies []Policy, now time.Time) (_ *Permit, _ error, done bool) {
	hk := bw.hot(key, now)
	if hk == nil {
		return nil, nil, false
	}
	for try := 0; try < 3; try++ {
		hk.mu.Lock()
		if try == 0 && !hk.tick(now) && hk.b == nil {
			hk.mu.Unlock()
			return nil, nil, false
		}
		if b := hk.b; b != nil {
			if b.policy != p {
				hk.b = nil
				hk.mu.Unlock()
				bw.giveBack(context.WithoutCancel(ctx), b)
				continue
			}
			if b.spend(cost, now) {
				left := b.left(b.clock.above(now).UnixMicro())
				hk.mu.Unlock()
				bw.spent.Add(ctx, int64(cost), bw.attrs)
				return bw.permit(key, cost, b.clock.below(now), b, left), nil, true
			}
			// Spent, or lapsed: what is left (fewer units than cost, or
			// none) lapses by itself.
			hk.b = nil
			b.timer.Stop()
			bw.stranded.Add(ctx, int64(b.units-b.spent), bw.attrs)
		}
		if wait := hk.pending; wait != nil {
			hk.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, ctx.Err(), true
			}
			now = time.Now()
			continue
		}
		pending := make(chan struct{})
		hk.pending = pending
		hk.mu.Unlock()
		permit, err, done := bw.borrow(ctx, hk, key, cost, p, policies)
		hk.mu.Lock()
		hk.pending = nil
		hk.mu.Unlock()
		close(pending)
		return permit, err, done
	}
	return nil, nil, false
}

// permit is a decision spent from b, reported at at (the database's time
// from below), with left units of the batch still spendable: the key's
// state as this replica sees it is the TAT the borrow left, less the units
// of the batch it may still spend. One allocation.
func (bw *borrower) permit(key string, cost int, at time.Time, b *batch, left int64) *Permit {
	one := &permitOne{}
	one.states[0] = stateOf(b.policy, at.UnixMicro(), b.end-left*b.t)
	one.policies[0] = b.policy
	one.Permit = Permit{Name: bw.l.name, Cost: cost, Policies: one.states[:], At: at,
		l: bw.l, key: key, policies: one.policies[:], borrowed: true}
	return &one.Permit
}

// permitOne is a Permit under one policy, allocated at once.
type permitOne struct {
	Permit
	states   [1]PolicyState
	policies [1]Policy
}

// borrow runs APIRequestWindowBorrow for a request of cost and keeps the
// batch it got.
func (bw *borrower) borrow(ctx context.Context, hk *hotKey, key string, cost int, p Policy, policies []Policy) (*Permit, error, bool) {
	l := bw.l
	t := p.emission()
	want := max(0, min(int64(p.burst()), (borrowSpan.Microseconds()+t-1)/t)-int64(cost))
	seq := l.memory.Seq()
	sent := time.Now()
	dctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	arg := &db.APIRequestWindowBorrowParams{
		Name: l.name, Key: key, Policy: p.Name, Unit: micros(t), Tolerance: micros(t * int64(p.burst())),
		Need: int32(cost), Want: int32(want),
	}
	var row *db.APIRequestWindowBorrowRow
	onShard, err := l.citus.On(dctx, l.pool)
	if err == nil && onShard {
		var r *db.APIRequestWindowBorrowOnShardRow
		r, err = l.q.APIRequestWindowBorrowOnShard(dctx, l.pool, (*db.APIRequestWindowBorrowOnShardParams)(arg))
		row = (*db.APIRequestWindowBorrowRow)(r)
	} else if err == nil {
		row, err = l.q.APIRequestWindowBorrow(dctx, l.pool, arg)
	}
	received := time.Now()
	err = dberr.OwnTimeout(dctx, err)
	cancel()
	l.obs.Took(ctx, observe.Check, sent)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, false // the key's row holds other policies
	}
	if err != nil {
		return nil, err, true
	}
	if !row.Allowed {
		d, err := l.judge(policies, cost, false, row.DecidedAt, []time.Time{row.Tat})
		if err != nil {
			return nil, err, true
		}
		l.remember(key, policies, cost, d, sent, received, seq)
		return nil, d.refusal, true
	}
	units := int(row.Borrowed)
	end := row.Tat.UnixMicro()
	base := end - int64(units)*t
	b := &batch{key: key, policy: p, t: t, clock: clock{row.DecidedAt, sent, received},
		next: base + int64(cost+1)*t, end: end, units: units, spent: cost, used: sent}
	bw.borrowed.Add(ctx, int64(units), bw.attrs)
	bw.spent.Add(ctx, int64(cost), bw.attrs)
	left := int64(units - cost)
	if left > 0 {
		hk.mu.Lock()
		old := hk.b
		hk.b = b
		b.timer = time.AfterFunc(quietAfter, func() { bw.quiet(hk, b) })
		hk.mu.Unlock()
		if old != nil { // (one borrow of a key at a time: not expected)
			old.timer.Stop()
			bw.stranded.Add(ctx, int64(old.units-old.spent), bw.attrs)
		}
	}
	return bw.permit(key, cost, row.DecidedAt, b, left), nil, true
}

// quiet gives b back when it has not been used for quietAfter, or looks
// again later.
func (bw *borrower) quiet(hk *hotKey, b *batch) {
	hk.mu.Lock()
	if hk.b != b {
		hk.mu.Unlock()
		return
	}
	if idle := time.Since(b.used); idle < quietAfter {
		b.timer.Reset(quietAfter - idle)
		hk.mu.Unlock()
		return
	}
	hk.b = nil
	hk.mu.Unlock()
	bw.giveBack(context.Background(), b)
}

// giveBack returns what b has not spent, if the key's TAT still ends where
// b does; b is no longer any key's batch.
func (bw *borrower) giveBack(ctx context.Context, b *batch) error {
	if b.timer != nil {
		b.timer.Stop()
	}
	bw.giving.Add(1)
	defer bw.giving.Done()
	at := b.clock.above(time.Now()).UnixMicro()
	// Positions below next are spent, or lapsed; the TAT goes back to the
	// highest spent one (the database takes the later of it and its clock).
	kept := b.next - b.t
	back := (b.end - max(kept, at)) / b.t
	unspent := int64(b.units - b.spent)
	if back <= 0 {
		bw.stranded.Add(ctx, unspent, bw.attrs)
		return nil
	}
	l := bw.l
	dctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	defer cancel()
	n, err := l.q.APIRequestWindowGiveBack(dctx, l.pool, &db.APIRequestWindowGiveBackParams{
		Kept: time.UnixMicro(kept), Name: l.name, Key: b.key, Policy: b.policy.Name, Tat: time.UnixMicro(b.end),
	})
	if err != nil || n == 0 {
		bw.stranded.Add(ctx, unspent, bw.attrs)
		return dberr.OwnTimeout(dctx, err)
	}
	back = min(back, unspent)
	bw.returned.Add(ctx, back, bw.attrs)
	bw.stranded.Add(ctx, unspent-back, bw.attrs)
	return nil
}

// drop forgets key's batch (an operator reset the key: its units mean
// nothing now).
func (bw *borrower) drop(key string) {
	sh := &bw.shards[maphash.String(bw.seed, key)%memo.Shards]
	sh.mu.Lock()
	hk := sh.m[key]
	sh.mu.Unlock()
	if hk == nil {
		return
	}
	hk.mu.Lock()
	if b := hk.b; b != nil {
		hk.b = nil
		b.timer.Stop()
	}
	hk.mu.Unlock()
}

// flush gives back every batch.
func (bw *borrower) flush(ctx context.Context) error {
	var batches []*batch
	for i := range bw.shards {
		sh := &bw.shards[i]
		sh.mu.Lock()
		for _, hk := range sh.m {
			hk.mu.Lock()
			if hk.b != nil {
				batches = append(batches, hk.b)
				hk.b = nil
			}
			hk.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	var errs []error
	for _, b := range batches {
		errs = append(errs, bw.giveBack(ctx, b))
	}
	bw.giving.Wait()
	return errors.Join(errs...)
}

package slots

// Kept slots (Config.Keep): a replica keeps the slot a request of a scope
// held, as a live row of the table, for up to Keep after the request
// ends, and the scope's next request on this replica takes it from memory
// with no statement.
//
// The bound: a request runs only while its replica holds a row of the
// table for it. A kept slot is such a row (its lease id, slot number and
// the time before which it cannot lapse are known here); a request starts
// on one only while its lease has at least the lease a fresh claim would
// have given (Claim.Lease) left, so a request on a kept slot has the same
// guarantee as one on a fresh slot, and the table's primary key keeps the
// rows of a scope, and so its requests in flight, at most its cap across
// every replica. To leave a kept slot reusable without a statement per
// request, a kept claim's lease is Claim.Lease + margin (margin =
// min(10 s, Claim.Lease / 4)), renewed to that from now, in one statement
// for every kept slot of the replica that needs it (SlotRenew), once it
// has less than Claim.Lease + margin/2 left: a slot in steady use costs a
// statement every margin/2, never one per request. A request that finds
// its kept slot short of Claim.Lease while the slot's lease still runs
// (its renewal is late: the sweep starved of CPU, or its statement slow)
// renews it itself, in that one statement, rather than give it back and
// claim again (two, and the slot may go to another replica meanwhile); it
// starts on it only if it then has Claim.Lease left. A replica killed while
// keeping slots leaves them to lapse at the end of that lease, at most
// Claim.Lease + margin after its last claim or renewal.
//
// Idle slots are given back in batches, one statement for many
// (SlotRelease): by the sweep (every tick, see tickOf) those idle longer
// than Keep, and every idle one while this replica's bus is not Live (it
// could not hear that another replica wants them, so it keeps none, and,
// refused, asks for none); at once those of a scope another replica was
// refused in. That replica sends "want" on the
// bus (bus.TopicSlots), and waits up to giveBackWait for a "gave" from a
// replica that gave some back before it claims again (and again on each
// "gave" heard, and once more at giveBackWait) and only then answers the
// refusal. A replica that heard "want" for a scope keeps none of its slots
// for wantedFor: its requests of the scope release at their end, as
// without Keep, so a scope moving between replicas is judged as it was
// without Keep.
//
// The longest a scope can be refused while it has room (its requests in
// flight fewer than its cap, idle kept slots elsewhere filling it): with
// the holders' buses Live, a refusal waits for them to give back and is
// false only when their give-back takes longer than giveBackWait; in any
// case an idle slot is given back at most Keep + tick + one statement
// after its request ended (a holder whose bus went silent stops keeping
// within bus.PingEvery + bus.PingWait, then gives its idle slots back on
// its next sweep).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/keys"
	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/permit"
)

const (
	// maxRenewMargin bounds what a kept claim's lease adds to
	// Claim.Lease (see margin).
	maxRenewMargin = 10 * time.Second
	// giveBackWait bounds how long a refused request of a kept scope waits
	// for other replicas to give their idle slots of it back before its
	// last claim: what a true refusal's answer is delayed by, at most.
	giveBackWait = 100 * time.Millisecond
	// wantedFor is how long a replica keeps no slot of a scope after it
	// heard another replica want it.
	wantedFor = time.Second
	// maxKept bounds the idle kept slots of one Limiter: past it a slot is
	// released at its request's end, as without Keep.
	maxKept = 10000
)

// margin is what a kept claim's lease adds to lease, the lease a claim
// gives: min(maxRenewMargin, lease/4).
func margin(lease time.Duration) time.Duration { return min(maxRenewMargin, lease/4) }

// keeper keeps the slots of one Limiter between requests. It is safe for
// concurrent use.
type keeper struct {
	l       *Limiter
	keep    time.Duration
	pool    *pgxpool.Pool
	q       *db.Queries
	kind    string
	timeout time.Duration
	bus     *bus.Bus
	sub     *bus.Subscription
	topic   string
	id      string // names this keeper on its messages

	mu      sync.Mutex
	scopes  map[string]*keptScope      // stored scope key -> its kept slots
	idle    int                        // idle kept slots, every scope
	waiters map[string][]chan struct{} // stored scope key -> refused requests waiting for a "gave"
	gaveAt  map[string]time.Time       // stored scope key -> when a "gave" was last heard (within giveBackWait)
	running bool                       // the sweep runs
	tick    time.Duration              // the sweep's period, set by the first kept claim
}

// keptScope is what this replica keeps of one scope.
type keptScope struct {
	idle      []*kept // by the end of their last request, oldest first
	busy      map[*kept]struct{}
	wanted    time.Time     // until then, keep nothing of it
	releasing int           // the keeper's releases of it in flight
	landed    chan struct{} // closed when they have all landed; nil when none is in flight
}

// kept is one slot this replica keeps.
type kept struct {
	k     *keeper
	lease *permit.Lease
	scope string // stored
	slot  int32
	full  time.Duration // the lease a claim or renewal gives it
	floor time.Duration // the least lease left on which a request may start
	until time.Time     // this replica's clock: the row lapses no sooner
	used  time.Time     // the end of its last request
	gen   uint64        // counts its requests
	busy  bool          // a request holds it
	lost  bool          // a renewal did not find it: it lapsed
}

func newKeeper(l *Limiter, pool *pgxpool.Pool, kind permit.Kind, keep, timeout time.Duration) *keeper {
	var id [8]byte
	_, _ = rand.Read(id[:])
	k := &keeper{l: l, keep: keep, pool: pool, q: db.New(), kind: string(kind), timeout: timeout,
		bus: bus.For(pool), topic: bus.TopicSlots + string(kind), id: hex.EncodeToString(id[:]),
		scopes: map[string]*keptScope{}, waiters: map[string][]chan struct{}{}, gaveAt: map[string]time.Time{}}
	k.sub = k.bus.Subscribe(k.topic, k.heard, nil)
	return k
}

// tickOf is the sweep's period for a kept lease of floor: half of Keep,
// and a quarter of the margin, so a slot in use is renewed before it has
// less than floor left; within 5 ms..1 s.
func (k *keeper) tickOf(floor time.Duration) time.Duration {
	return min(max(min(k.keep/2, margin(floor)/4), 5*time.Millisecond), time.Second)
}

// scope returns ks of scope, made if missing. k.mu is held.
func (k *keeper) scope(scope string) *keptScope {
	ks := k.scopes[scope]
	if ks == nil {
		ks = &keptScope{busy: map[*kept]struct{}{}}
		k.scopes[scope] = ks
	}
	return ks
}

// forget drops ks when it keeps nothing. k.mu is held.
func (k *keeper) forget(scope string, ks *keptScope) {
	if len(ks.idle) == 0 && len(ks.busy) == 0 && ks.releasing == 0 {
		delete(k.scopes, scope)
	}
}

// take gives a request of scope an idle kept slot with at least its floor
// of lease left, most recently used first, or ok false. One whose lease
// still runs but has less than its floor left (its renewal is late: the
// sweep was starved of CPU, or its statement is slow) comes back in late,
// held for the request, which renews it (renewLate) rather than give it
// back and claim again. The idle slots it found lapsed or lost before (or
// every one, while the bus is not Live) come back in stale, taken out of
// the idle ones and marked releasing: the caller releases them before it
// claims.
func (k *keeper) take(scope string, now time.Time) (h Held, ok bool, late *kept, stale []*kept) {
	live := k.bus.Live()
	k.mu.Lock()
	defer k.mu.Unlock()
	ks := k.scopes[scope]
	if ks == nil {
		return Held{}, false, nil, nil
	}
	for len(ks.idle) > 0 {
		s := ks.idle[len(ks.idle)-1]
		ks.idle = ks.idle[:len(ks.idle)-1]
		k.idle--
		if live && !s.lost && s.until.After(now) {
			s.busy = true
			s.gen++
			ks.busy[s] = struct{}{}
			if s.until.Sub(now) < s.floor {
				late = s
				break
			}
			h, ok = Held{lease: s.lease, kept: s, gen: s.gen}, true
			break
		}
		stale = append(stale, s)
	}
	if len(stale) > 0 {
		k.releasing(ks)
	}
	return h, ok, late, stale
}

// renewLate renews s, a kept slot take held for a request with less than
// its floor of lease left, in one statement on the request's path, and
// returns it held when it then has its floor left. Otherwise (the row
// lapsed, the renewal failed, or its statement took longer than the
// margin) it gives s back, in one more statement, and reports false: the
// request claims a slot as without it.
func (k *keeper) renewLate(s *kept) (Held, bool) {
	k.renew([]*kept{s})
	k.mu.Lock()
	if !s.lost && time.Until(s.until) >= s.floor {
		defer k.mu.Unlock()
		return Held{lease: s.lease, kept: s, gen: s.gen}, true
	}
	s.busy = false
	ks := k.scopes[s.scope]
	delete(ks.busy, s)
	k.releasing(ks)
	k.mu.Unlock()
	k.release([]*kept{s})
	return Held{}, false
}

// releasing marks a release of ks's slots in flight. k.mu is held.
func (k *keeper) releasing(ks *keptScope) {
	if ks.releasing == 0 {
		ks.landed = make(chan struct{})
	}
	ks.releasing++
}

// settle waits until the keeper's releases of scope in flight have
// landed, so that a claim of this replica never finds its own idle slots
// held.
func (k *keeper) settle(ctx context.Context, scope string) error {
	k.mu.Lock()
	var landed chan struct{}
	if ks := k.scopes[scope]; ks != nil {
		landed = ks.landed
	}
	k.mu.Unlock()
	if landed == nil {
		return nil
	}
	select {
	case <-landed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hold registers a granted claim of scope as a kept slot in use.
func (k *keeper) hold(lease *permit.Lease, scope string, full, floor time.Duration, until time.Time) Held {
	s := &kept{k: k, lease: lease, scope: scope, slot: int32(lease.Slots[0]), full: full, floor: floor,
		until: until, gen: 1, busy: true}
	k.mu.Lock()
	k.scope(scope).busy[s] = struct{}{}
	if !k.running {
		k.running = true
		k.tick = k.tickOf(floor)
		go k.run()
	}
	k.mu.Unlock()
	return Held{lease: lease, kept: s, gen: 1}
}

// put ends the request gen of s: it keeps s idle and reports true, or
// reports false when the caller must release it (the bus is not Live, its
// scope is wanted elsewhere, too many are kept, it lapsed). A request
// already ended (a second release) is kept as it was: true.
func (k *keeper) put(s *kept, gen uint64) bool {
	now := time.Now()
	live := k.bus.Live()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !s.busy || s.gen != gen {
		return true
	}
	s.busy = false
	ks := k.scopes[s.scope]
	delete(ks.busy, s)
	if live && !s.lost && now.After(ks.wanted) && k.idle < maxKept {
		s.used = now
		ks.idle = append(ks.idle, s)
		k.idle++
		return true
	}
	k.forget(s.scope, ks)
	return false
}

// release gives slots back in one statement (SlotRelease) and reports
// how many rows it released. The slots were taken out of the idle ones
// and marked releasing (one mark per slot's scope and call); it marks them
// landed. A release that fails is logged: the slots lapse on their own.
func (k *keeper) release(slots []*kept) int64 {
	if len(slots) == 0 {
		return 0
	}
	p := &db.SlotReleaseParams{Kind: k.kind}
	seen := map[string]bool{}
	for _, s := range slots {
		if !seen[s.scope] {
			seen[s.scope] = true
			p.Scopes = append(p.Scopes, s.scope)
		}
		p.LeaseIds = append(p.LeaseIds, s.lease.ID.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
	defer cancel()
	start := time.Now()
	n, err := k.q.SlotRelease(ctx, k.pool, p)
	took := time.Since(start)
	if err != nil {
		k.l.Log.Warn(k.l.Pkg+": release of kept slots failed; they lapse on their own at the end of their lease",
			"limit", k.l.Name, "slots", len(slots), "err", err)
	}
	for range slots {
		k.l.obs.Released(took, err)
	}
	k.mu.Lock()
	for scope := range seen {
		ks := k.scopes[scope]
		if ks == nil {
			continue
		}
		if ks.releasing--; ks.releasing == 0 {
			close(ks.landed)
			ks.landed = nil
		}
		k.forget(scope, ks)
	}
	k.mu.Unlock()
	return n
}

// run sweeps every tick until nothing is kept.
func (k *keeper) run() {
	t := time.NewTicker(k.tick)
	defer t.Stop()
	for range t.C {
		if !k.sweep(time.Now()) {
			return
		}
	}
}

// sweep gives back the idle slots kept longer than Keep (every idle one
// while the bus is not Live), in one statement, and renews, in another,
// the kept slots that have less than floor + margin/2 of lease left. It
// reports false, and the sweep ends, when nothing is kept.
func (k *keeper) sweep(now time.Time) bool {
	live := k.bus.Live()
	var out, renew []*kept
	k.mu.Lock()
	for scope, ks := range k.scopes {
		// The idle slots are in the order their requests ended: those
		// idle longer than Keep come first.
		n := 0
		for n < len(ks.idle) && (!live || ks.idle[n].lost || now.Sub(ks.idle[n].used) > k.keep) {
			n++
		}
		if n > 0 {
			out = append(out, ks.idle[:n]...)
			ks.idle = append(ks.idle[:0:0], ks.idle[n:]...)
			k.idle -= n
			k.releasing(ks)
		}
		due := func(s *kept) bool { return !s.lost && s.until.Sub(now) < s.floor+(s.full-s.floor)/2 }
		for _, s := range ks.idle {
			if due(s) {
				renew = append(renew, s)
			}
		}
		for s := range ks.busy {
			if due(s) {
				renew = append(renew, s)
			}
		}
		k.forget(scope, ks)
	}
	if len(k.scopes) == 0 {
		k.running = false
		k.mu.Unlock()
		return false
	}
	k.mu.Unlock()
	k.release(out)
	k.renew(renew)
	return true
}

// renew renews slots' leases, one statement per lease length (one for
// an in-flight cap), and forgets those it did not find.
func (k *keeper) renew(slots []*kept) {
	byFull := map[time.Duration][]*kept{}
	for _, s := range slots {
		byFull[s.full] = append(byFull[s.full], s)
	}
	for full, group := range byFull {
		p := &db.SlotRenewParams{Kind: k.kind, LeaseMs: full.Milliseconds()}
		for _, s := range group {
			p.Scopes = append(p.Scopes, s.scope)
			p.Slots = append(p.Slots, s.slot)
			p.LeaseIds = append(p.LeaseIds, s.lease.ID.String())
		}
		ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
		start := time.Now()
		rows, err := k.q.SlotRenew(ctx, k.pool, p)
		cancel()
		if err != nil {
			k.l.Log.Warn(k.l.Pkg+": renewing kept slots failed; they are released when they run short",
				"limit", k.l.Name, "slots", len(group), "err", err)
			continue
		}
		found := map[uuid.UUID]bool{}
		for _, id := range rows {
			found[id] = true
		}
		until := start.Add(full)
		k.mu.Lock()
		for _, s := range group {
			if found[s.lease.ID] {
				// Two renewals of one slot may overlap (the sweep's and a
				// request's, renewLate): the later start stands.
				if until.After(s.until) {
					s.until = until
				}
			} else {
				// It lapsed, or someone else released it: no longer ours.
				s.lost = true
			}
		}
		k.mu.Unlock()
	}
}

// errNoBus is a give-back request that could not be sent.
var errNoBus = errors.New("slots: the give-back request was not sent")

// giveBack asks the other replicas for their idle slots of scope and
// claims again (claim) when one says it gave some back, and once more at
// giveBackWait; it returns the first grant, or the last claim's outcome.
// errNoBus: the request could not be sent (the caller keeps its refusal).
// Requests of scope refused while one of this replica's already waits
// send nothing: they wait for the answer to the one sent.
// A "gave" heard since the refused claim started (since) wakes it at once.
func (k *keeper) giveBack(ctx context.Context, scope string, since time.Time, claim func() (*permit.Lease, time.Time, error)) (*permit.Lease, time.Time, error) {
	ch := make(chan struct{})
	k.mu.Lock()
	send := len(k.waiters[scope]) == 0
	if at, ok := k.gaveAt[scope]; ok && at.After(since) {
		close(ch)
		send = false
	} else {
		k.waiters[scope] = append(k.waiters[scope], ch)
	}
	k.mu.Unlock()
	defer k.unwait(scope, &ch)
	if send {
		nctx, cancel := context.WithTimeout(ctx, k.timeout)
		err := k.q.BusNotify(nctx, k.pool, k.topic+"\nwant "+k.id+" "+scope)
		cancel()
		if err != nil {
			return nil, time.Time{}, errNoBus
		}
	}
	deadline := time.NewTimer(giveBackWait)
	defer deadline.Stop()
	for {
		last := false
		select {
		case <-ch:
		case <-deadline.C:
			last = true
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		}
		lease, until, err := claim()
		var r *Refused
		if !errors.As(err, &r) || last {
			return lease, until, err
		}
		ch = make(chan struct{})
		k.mu.Lock()
		k.waiters[scope] = append(k.waiters[scope], ch)
		k.mu.Unlock()
	}
}

// unwait drops the waiter *ch of scope, if a "gave" has not.
func (k *keeper) unwait(scope string, ch *chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	list := k.waiters[scope]
	for i, c := range list {
		if c == *ch {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(k.waiters, scope)
	} else {
		k.waiters[scope] = list
	}
}

// heard handles a message of the bus: another keeper's "want" (give back
// the idle slots of its scope now, keep none for wantedFor, and say "gave"
// when some were given back) or "gave" (wake the requests waiting for
// it). It runs on the bus's goroutine: the statements run on their own.
func (k *keeper) heard(msg string) {
	verb, rest, _ := strings.Cut(msg, " ")
	from, scope, ok := strings.Cut(rest, " ")
	if !ok || from == k.id {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	switch verb {
	case "gave":
		for _, ch := range k.waiters[scope] {
			close(ch)
		}
		delete(k.waiters, scope)
		// Remembered for giveBackWait, for the requests refused before it
		// came that wait for it only after.
		now := time.Now()
		if len(k.gaveAt) >= maxKept {
			for sc, at := range k.gaveAt {
				if now.Sub(at) > giveBackWait {
					delete(k.gaveAt, sc)
				}
			}
		}
		if len(k.gaveAt) < maxKept {
			k.gaveAt[scope] = now
		}
	case "want":
		ks := k.scopes[scope]
		if ks == nil {
			return
		}
		ks.wanted = time.Now().Add(wantedFor)
		if len(ks.idle) == 0 {
			return
		}
		out := ks.idle
		ks.idle = nil
		k.idle -= len(out)
		k.releasing(ks)
		go func() {
			if k.release(out) == 0 {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
			defer cancel()
			if err := k.q.BusNotify(ctx, k.pool, k.topic+"\ngave "+k.id+" "+scope); err != nil {
				k.l.Log.Warn(k.l.Pkg+": telling that kept slots were given back failed", "limit", k.l.Name, "err", err)
			}
		}()
	}
}

// flush gives back every idle kept slot, in one statement, and waits for
// the keeper's releases in flight to land, or ctx.
func (k *keeper) flush(ctx context.Context) error {
	var out []*kept
	k.mu.Lock()
	for _, ks := range k.scopes {
		if len(ks.idle) > 0 {
			out = append(out, ks.idle...)
			k.idle -= len(ks.idle)
			ks.idle = nil
			k.releasing(ks)
		}
	}
	k.mu.Unlock()
	k.release(out)
	for {
		var landed []chan struct{}
		k.mu.Lock()
		for _, ks := range k.scopes {
			if ks.landed != nil {
				landed = append(landed, ks.landed)
			}
		}
		k.mu.Unlock()
		if len(landed) == 0 {
			return nil
		}
		for _, ch := range landed {
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// claimKept is Claim for a Limiter that keeps its slots (one scope).
func (l *Limiter) claimKept(ctx context.Context, key string, c permit.Claim, args ...any) (Held, *Refused, bool, error) {
	k := l.keeper
	scope := keys.Stored(c.Scopes[0].Key)
	h, ok, late, stale := k.take(scope, time.Now())
	k.release(stale)
	if late != nil {
		h, ok = k.renewLate(late)
	}
	if ok {
		l.obs.GrantedFromMemory(ctx, l.scope)
		return h, nil, false, nil
	}
	floor := c.Lease
	c.Lease = floor + margin(floor)
	claim := func() (*permit.Lease, time.Time, error) {
		if err := k.settle(ctx, scope); err != nil {
			return nil, time.Time{}, err
		}
		start := time.Now()
		lease, err := l.leaser.Claim(ctx, c)
		l.obs.Took(ctx, observe.Claim, start)
		return lease, start.Add(c.Lease), err
	}
	since := time.Now()
	lease, until, err := claim()
	var refused *Refused
	if errors.As(err, &refused) && k.bus.Live() {
		if l2, u2, err2 := k.giveBack(ctx, scope, since, claim); !errors.Is(err2, errNoBus) {
			lease, until, err = l2, u2, err2
		}
	}
	if err != nil {
		return l.notGranted(ctx, key, err, args...)
	}
	l.obs.Granted(ctx, l.scope)
	return k.hold(lease, scope, c.Lease, floor, until), nil, false, nil
}

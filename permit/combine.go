package permit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/dberr"
)

// op is one claim or one release waiting for, or travelling in, a batch.
type op struct {
	claim   *Claim    // a claim, or nil
	release []string  // the scope keys of a release, or nil
	id      uuid.UUID // the lease id
	seq     uint64    // order of arrival; a give-back has its claim's

	// raced: a claim sent while a release of one of its scopes travelled
	// in another batch of this Leaser; retry: a claim refused so, queued
	// again to be judged after that release. Both are guarded by l.mu.
	raced, retry bool

	// state moves from queued to sent to done; a caller that stops waiting
	// moves queued or sent to abandoned. Only the Leaser's mutex guards the
	// queued -> sent and queued -> abandoned moves; the others are atomic.
	state atomic.Int32
	done  chan struct{}

	// Results, written before done is closed.
	slots   []int
	refused *RefusedError
	err     error
}

const (
	queued int32 = iota
	sent
	finished
	abandoned
)

// wait puts the claim o in the queue, makes sure a flusher will send it,
// and waits for its outcome or for ctx. A claim abandoned in flight is
// given back when it is granted.
func (l *Leaser) wait(ctx context.Context, o *op) error {
	o.claim = stored(o.claim)
	l.enqueue(o)
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	if o.state.Load() == queued {
		l.queue = slices.DeleteFunc(l.queue, func(x *op) bool { return x == o })
		o.state.Store(abandoned)
		delete(l.pending, o)
		l.mu.Unlock()
		return ctx.Err()
	}
	l.mu.Unlock()
	if o.state.CompareAndSwap(sent, abandoned) {
		return ctx.Err()
	}
	<-o.done // it finished as ctx ended: keep the outcome
	return nil
}

// enqueue queues o and makes sure a flusher will send it. A release's
// caller waits for its done, or stops waiting when its ctx ends.
func (l *Leaser) enqueue(o *op) {
	if o.release != nil {
		keys := make([]string, len(o.release))
		for i, k := range o.release {
			keys[i] = storedKey(k)
		}
		o.release = keys
	}
	l.mu.Lock()
	l.push(o)
	l.mu.Unlock()
}

// push is enqueue with l.mu held.
func (l *Leaser) push(o *op) {
	if o.seq == 0 {
		l.seq++
		o.seq = l.seq
	}
	l.pending[o] = struct{}{}
	l.queue = append(l.queue, o)
	if l.flushers < maxFlushers {
		l.flushers++
		go l.flush()
	}
}

// Flush waits until every release made before it was called has reached
// the database (and every slot a claim made before it had to give back),
// and returns their errors, if any, or ctx's when it ends first. Call it
// at shutdown, after the work that holds leases has stopped (for a server:
// after http.Server.Shutdown returned), so that no release is lost with
// the process.
func (l *Leaser) Flush(ctx context.Context) error {
	l.mu.Lock()
	upTo := l.seq
	l.mu.Unlock()
	var errs []error
	seen := map[*op]bool{}
	for {
		var wait []*op
		l.mu.Lock()
		for o := range l.pending {
			if o.seq <= upTo && !seen[o] {
				wait = append(wait, o)
			}
		}
		l.mu.Unlock()
		if len(wait) == 0 {
			return errors.Join(errs...)
		}
		for _, o := range wait {
			seen[o] = true
			select {
			case <-o.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if o.release != nil && o.err != nil && !slices.ContainsFunc(errs, func(e error) bool { return e == o.err }) {
				errs = append(errs, o.err)
			}
		}
	}
}

// flush sends batches while there is work, then ends.
func (l *Leaser) flush() {
	for {
		l.mu.Lock()
		batch := l.take()
		if len(batch) == 0 {
			l.flushers--
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		l.send(batch)
	}
}

// take removes from the queue, in order, the ops that can travel together
// (at most maxBatch): every release, and the claims that keep the batch
// judged exactly as one claim after another would be (see SlotClaim): a
// scope is either every claim's own scope or every claim's second scope,
// claims with the same own scope have the same second scope, and a scope
// has one cap. A claim that does not fit waits for the next batch, and so
// does a claim being retried while a release of one of its scopes is still
// in flight. The caller holds l.mu.
func (l *Leaser) take() []*op {
	if len(l.queue) == 0 {
		return nil
	}
	var (
		batch  []*op
		rest   = l.queue[:0:0]
		role   = map[string]int{}    // scope key -> 1 (own) or 2 (second)
		second = map[string]string{} // own key -> its second key ("" none)
		caps   = map[string]int{}
	)
	fits := func(c *Claim) bool {
		own := c.Scopes[0]
		want2 := ""
		if len(c.Scopes) == 2 {
			want2 = c.Scopes[1].Key
		}
		if r, ok := role[own.Key]; ok && r != 1 {
			return false
		}
		if s, ok := second[own.Key]; ok && s != want2 {
			return false
		}
		for i, s := range c.Scopes {
			if r, ok := role[s.Key]; ok && r != i+1 {
				return false
			}
			if cp, ok := caps[s.Key]; ok && cp != s.Cap {
				return false
			}
		}
		return true
	}
	for _, o := range l.queue {
		if len(batch) == l.maxBatch {
			rest = append(rest, o)
			continue
		}
		if o.claim != nil {
			if o.retry && l.releasingAny(o.claim) || !fits(o.claim) {
				rest = append(rest, o)
				continue
			}
			c := o.claim
			second[c.Scopes[0].Key] = ""
			for i, s := range c.Scopes {
				role[s.Key] = i + 1
				caps[s.Key] = s.Cap
			}
			if len(c.Scopes) == 2 {
				second[c.Scopes[0].Key] = c.Scopes[1].Key
			}
			// A release in this batch runs before the claim; one in a
			// batch already in flight may not have committed when the
			// claim's statement looks.
			o.raced = l.releasingAny(c)
		}
		o.state.Store(sent)
		batch = append(batch, o)
	}
	for _, o := range batch {
		for _, k := range o.release {
			l.releasing[k]++
		}
	}
	l.queue = rest
	return batch
}

// releasingAny reports whether a release of one of c's scopes travels in a
// batch in flight. The caller holds l.mu.
func (l *Leaser) releasingAny(c *Claim) bool {
	for _, s := range c.Scopes {
		if l.releasing[s.Key] > 0 {
			return true
		}
	}
	return false
}

// send runs one batch — the scope locks, the releases, then the claims,
// in one pgx Batch (one round trip, one implicit transaction) — and hands
// every op its outcome. Releases go before claims, so a claim never finds
// held a slot that a release of the same batch gives back; a claim refused
// while a release of its scopes was in flight in another batch of this
// Leaser is judged again after it (a caller that released and then claimed
// never sees its own release pending).
func (l *Leaser) send(ops []*op) {
	ctx, cancel := dberr.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	start := time.Now()

	var (
		rel    = db.SlotReleaseParams{Kind: string(l.kind)}
		claims []*op
		scopes []string
	)
	for _, o := range ops {
		if o.claim == nil {
			rel.Scopes = append(rel.Scopes, o.release...)
			rel.LeaseIds = append(rel.LeaseIds, o.id.String())
			continue
		}
		claims = append(claims, o)
		for _, s := range o.claim.Scopes {
			scopes = append(scopes, s.Key)
		}
	}

	var (
		rows []*db.SlotClaimRow
		err  error
		b    = &batch{conn: l.pool}
	)
	// The statements travel in one batch: see sql/queries/slot.sql.
	if len(claims) == 0 {
		// Releases alone: one statement, no planner settings (they cost a
		// statement of their own and the release plans cheaply).
		_, _ = l.q.SlotRelease(ctx, b, &rel)
		err = b.send(ctx)
	} else {
		_ = l.q.SlotLockScopes(ctx, b, &db.SlotLockScopesParams{Kind: string(l.kind), Scopes: scopes})
		if len(rel.LeaseIds) > 0 {
			_, _ = l.q.SlotRelease(ctx, b, &rel)
		}
		rows, err = l.claim(ctx, b, claims)
		if err == nil {
			err = b.closeErr
		}
		if err == nil {
			err = l.judge(claims, rows)
		}
	}
	// The round trip's bound is the Leaser's Timeout, never a caller's
	// context: when it ends the batch, the database did not answer in time
	// (pglimit.Classify: unavailable).
	err = dberr.OwnTimeout(ctx, err)
	if err != nil && len(rel.LeaseIds) > 0 {
		l.log.Warn("permit: release failed; the slots lapse on their own at the end of their lease",
			"kind", string(l.kind), "leases", len(rel.LeaseIds), "err", err)
	}

	l.mu.Lock()
	var done []*op
	for _, o := range ops {
		for _, k := range o.release {
			if l.releasing[k]--; l.releasing[k] == 0 {
				delete(l.releasing, k)
			}
		}
		if err == nil && o.refused != nil && o.raced && !o.retry && o.state.CompareAndSwap(sent, queued) {
			// Judge it again once the release it raced has landed, under
			// a lease id of its own (nothing of the first try can touch it).
			o.refused, o.slots, o.raced, o.retry, o.id = nil, nil, false, true, uuid.New()
			l.queue = append([]*op{o}, l.queue...)
			continue
		}
		if err != nil {
			o.err = err
		}
		if !o.state.CompareAndSwap(sent, finished) && o.claim != nil && o.err == nil && o.refused == nil {
			// Its caller stopped waiting: give the slots back.
			l.push(giveBack(o))
		}
		done = append(done, o)
		delete(l.pending, o)
	}
	// A claim left queued while a release of its scopes was in flight may
	// have seen every other flusher end meanwhile: make sure one will send
	// it (this one, or another).
	if len(l.queue) > 0 && l.flushers < maxFlushers {
		l.flushers++
		go l.flush()
	}
	l.mu.Unlock()
	if l.onRel != nil {
		took := time.Since(start)
		for range rel.LeaseIds {
			l.onRel(took, err)
		}
	}
	for _, o := range done {
		close(o.done)
	}
}

// claim queues the claim statement of claims on b and sends the batch:
// SlotClaimOne for a lone claim, SlotClaim for several.
func (l *Leaser) claim(ctx context.Context, b *batch, claims []*op) ([]*db.SlotClaimRow, error) {
	if len(claims) == 1 {
		c := claims[0].claim
		p := &db.SlotClaimOneParams{Kind: string(l.kind), LeaseID: claims[0].id.String(), Holder: c.Holder,
			Endpoint: c.Endpoint, Replica: l.replica, LeaseMs: c.Lease.Milliseconds()}
		for _, s := range c.Scopes {
			p.Scopes = append(p.Scopes, s.Key)
			p.Caps = append(p.Caps, int32(s.Cap))
		}
		one, err := l.q.SlotClaimOne(ctx, b, p)
		if err != nil {
			return nil, err
		}
		rows := make([]*db.SlotClaimRow, len(one))
		for i, r := range one {
			rows[i] = &db.SlotClaimRow{Claim: 1, Pos: r.Pos, GrantedSlot: r.GrantedSlot, Live: r.Live, Cap: r.Cap,
				FirstLapseMs: r.FirstLapseMs}
		}
		return rows, nil
	}
	p := &db.SlotClaimParams{Kind: string(l.kind), Replica: l.replica}
	for n, o := range claims {
		c := o.claim
		for i, s := range c.Scopes {
			p.Claims = append(p.Claims, int32(n+1))
			p.Positions = append(p.Positions, int32(i+1))
			p.Scopes = append(p.Scopes, s.Key)
			p.Caps = append(p.Caps, int32(s.Cap))
		}
		p.LeaseIds = append(p.LeaseIds, o.id.String())
		p.Holders = append(p.Holders, c.Holder)
		p.Endpoints = append(p.Endpoints, c.Endpoint)
		p.LeaseMs = append(p.LeaseMs, c.Lease.Milliseconds())
	}
	return l.q.SlotClaim(ctx, b, p)
}

// giveBack is the release of every slot of the claim o.
func giveBack(o *op) *op {
	keys := make([]string, len(o.claim.Scopes))
	for i, s := range o.claim.Scopes {
		keys[i] = s.Key
	}
	return &op{release: keys, id: o.id, seq: o.seq, done: make(chan struct{})}
}

// errShape is a claim statement that answered rows the batch did not ask
// for: a bug, never a refusal.
var errShape = errors.New("the claim statement's rows do not match the batch")

// judge reads the claim statement's rows (one per claim and scope, in
// order) into each claim's outcome. A claim granted in some scopes but not
// all cannot happen while the scope locks are held; it would be given back
// and refused rather than kept.
func (l *Leaser) judge(claims []*op, rows []*db.SlotClaimRow) error {
	want := 0
	for _, o := range claims {
		want += len(o.claim.Scopes)
	}
	if len(rows) != want {
		return errShape
	}
	// taken counts, per scope, the slots granted to the batch so far, so a
	// refusal says how many were live when its turn came.
	taken := map[string]int{}
	i := 0
	for n, o := range claims {
		c := o.claim
		mine := rows[i : i+len(c.Scopes)]
		i += len(c.Scopes)
		granted := 0
		for k, r := range mine {
			if int(r.Claim) != n+1 || int(r.Pos) != k+1 {
				return errShape
			}
			if r.GrantedSlot > 0 {
				granted++
			}
		}
		if granted == len(mine) {
			o.slots = make([]int, len(mine))
			for k, r := range mine {
				o.slots[k] = int(r.GrantedSlot)
				taken[c.Scopes[k].Key]++
			}
			continue
		}
		if granted > 0 {
			l.enqueue(giveBack(o))
		}
		// The claims before this one were granted exactly as if judged one
		// after another, so the scope that refused it is, as then, the
		// first that was full in its turn: its live slots and the slots
		// the batch granted before it reach its cap.
		full := len(mine) - 1
		for k, r := range mine {
			if int(r.Live)+taken[c.Scopes[k].Key] >= int(r.Cap) {
				full = k
				break
			}
		}
		r := mine[full]
		lapse := time.Duration(r.FirstLapseMs) * time.Millisecond
		if r.Live == 0 {
			// Only claims of this batch hold the scope: the first of them
			// lapses a whole lease from now.
			lapse = c.Lease
		}
		o.refused = &RefusedError{Scope: c.Scopes[full], Live: int(r.Live) + taken[c.Scopes[full].Key], FirstLapse: lapse}
	}
	return nil
}

// stored returns c with keys the database can store and texts it can hold.
func stored(c *Claim) *Claim {
	out := *c
	out.Scopes = make([]Scope, len(c.Scopes))
	for i, s := range c.Scopes {
		out.Scopes[i] = Scope{Key: storedKey(s.Key), Cap: s.Cap}
	}
	out.Holder, out.Endpoint = storable(c.Holder), storable(c.Endpoint)
	return &out
}

// storedKey is key itself when PostgreSQL text can hold it and it is at
// most 200 bytes, otherwise "sha256:" and its hex digest: distinct keys
// stay distinct, and no key can make a statement fail.
func storedKey(key string) string {
	if len(key) <= 200 && utf8.ValidString(key) && !containsNUL(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

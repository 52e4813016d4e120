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

// wait puts o in the queue, makes sure a flusher will send it, and waits
// for its outcome or for ctx. A claim abandoned in flight is given back
// when it is granted; a release abandoned goes ahead anyway.
func (l *Leaser) wait(ctx context.Context, o *op) error {
	if o.claim != nil {
		o.claim = stored(o.claim)
	} else {
		keys := make([]string, len(o.release))
		for i, k := range o.release {
			keys[i] = storedKey(k)
		}
		o.release = keys
	}
	l.mu.Lock()
	l.queue = append(l.queue, o)
	start := l.flushers < maxFlushers
	if start {
		l.flushers++
	}
	l.mu.Unlock()
	if start {
		go l.flush()
	}
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
	}
	if o.release != nil {
		// A release is worth finishing for the next claimer: it stays
		// queued, and its caller stops waiting.
		return ctx.Err()
	}
	l.mu.Lock()
	if o.state.Load() == queued {
		l.queue = slices.DeleteFunc(l.queue, func(x *op) bool { return x == o })
		o.state.Store(abandoned)
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
// has one cap. A claim that does not fit waits for the next batch. The
// caller holds l.mu.
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
			if !fits(o.claim) {
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
		}
		o.state.Store(sent)
		batch = append(batch, o)
	}
	l.queue = rest
	return batch
}

// send runs one batch: the releases, then the scope locks and the claim,
// in one pgx Batch (one round trip, one implicit transaction), and hands
// every op its outcome.
func (l *Leaser) send(ops []*op) {
	ctx, cancel := dberr.WithTimeout(context.Background(), l.timeout)
	defer cancel()

	var (
		rel    db.SlotReleaseParams
		claim  db.SlotClaimParams
		claims []*op
	)
	rel.Kind, claim.Kind, claim.Replica = string(l.kind), string(l.kind), l.replica
	for _, o := range ops {
		if o.claim == nil {
			for _, k := range o.release {
				rel.Scopes = append(rel.Scopes, k)
				rel.LeaseIds = append(rel.LeaseIds, o.id.String())
			}
			continue
		}
		claims = append(claims, o)
		n := int32(len(claims))
		c := o.claim
		for i, s := range c.Scopes {
			claim.Claims = append(claim.Claims, n)
			claim.Positions = append(claim.Positions, int32(i+1))
			claim.Scopes = append(claim.Scopes, s.Key)
			claim.Caps = append(claim.Caps, int32(s.Cap))
		}
		claim.LeaseIds = append(claim.LeaseIds, o.id.String())
		claim.Holders = append(claim.Holders, c.Holder)
		claim.Endpoints = append(claim.Endpoints, c.Endpoint)
		claim.LeaseMs = append(claim.LeaseMs, c.Lease.Milliseconds())
	}

	var (
		rows []*db.SlotClaimRow
		err  error
	)
	switch {
	case len(claims) == 0:
		_, err = l.q.SlotRelease(ctx, l.pool, &rel)
	default:
		// The statements travel in one batch: see sql/queries/slot.sql.
		b := &batch{conn: l.pool}
		if len(rel.Scopes) > 0 {
			_, _ = l.q.SlotRelease(ctx, b, &rel)
		}
		_ = l.q.SlotLockScopes(ctx, b, &db.SlotLockScopesParams{Kind: string(l.kind), Scopes: claim.Scopes})
		rows, err = l.q.SlotClaim(ctx, b, &claim)
		if err == nil {
			err = b.closeErr
		}
	}
	if err == nil && len(claims) > 0 {
		err = l.judge(claims, rows)
	}
	// The round trip's bound is the Leaser's Timeout, never a caller's
	// context: when it ends the batch, the database did not answer in time
	// (pglimit.Classify: unavailable).
	err = dberr.OwnTimeout(ctx, err)
	var giveBack []*op
	for _, o := range ops {
		if err != nil {
			o.err = err
		}
		if !o.state.CompareAndSwap(sent, finished) && o.claim != nil && o.err == nil && o.refused == nil {
			// Its caller stopped waiting: give the slots back.
			giveBack = append(giveBack, o)
		}
		close(o.done)
	}
	for _, o := range giveBack {
		keys := make([]string, len(o.claim.Scopes))
		for i, s := range o.claim.Scopes {
			keys[i] = s.Key
		}
		l.enqueue(&op{release: keys, id: o.id, done: make(chan struct{})})
	}
}

// enqueue queues o with nobody waiting for it.
func (l *Leaser) enqueue(o *op) {
	l.mu.Lock()
	l.queue = append(l.queue, o)
	start := l.flushers < maxFlushers
	if start {
		l.flushers++
	}
	l.mu.Unlock()
	if start {
		go l.flush()
	}
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
			keys := make([]string, len(c.Scopes))
			for k, s := range c.Scopes {
				keys[k] = s.Key
			}
			l.enqueue(&op{release: keys, id: o.id, done: make(chan struct{})})
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

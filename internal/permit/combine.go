// Combining: the claims and releases of many goroutines queued and combined
// into batches, which send.go sends.

package permit

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/pglimit/pglimit/internal/keys"
)

// op is one claim or one release waiting for, or travelling in, a batch.
type op struct {
	claim   *Claim    // a claim, or nil
	release []string  // the scope keys of a release, or nil
	id      uuid.UUID // the lease id
	seq     uint64    // order of arrival; a give-back has its claim's

	// raced: a claim sent while a release of one of its scopes travelled
	// in another batch of this Leaser; lost: a claim that found room in
	// every scope but lost the free slot it picked to another claim (one
	// that did not take the scope lock, see SlotClaimLone); retry: a claim
	// refused so or lost so, queued again to be judged under the scope lock
	// (after that release); locked: a claim that takes the scope lock in
	// this round trip (a retry, or a claim of a scope that lost a race
	// lately); tries counts its retries. All are guarded by l.mu.
	raced, lost, retry, locked bool
	tries                      int

	// slotNos are a release's slot numbers, in the order of its scope keys
	// (SlotReleaseOne, SlotReleaseTwo), or nil when they are not known (a
	// give-back).
	slotNos []int

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
	if err := ctx.Err(); err != nil {
		return err
	}
	if !l.inline(ctx, o) {
		l.enqueue(o)
	}
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
		stored := make([]string, len(o.release))
		for i, k := range o.release {
			stored[i] = keys.Stored(k)
		}
		o.release = stored
	}
	l.mu.Lock()
	l.push(o)
	l.mu.Unlock()
}

// releaseNow sends the release o: on the caller's goroutine when nothing
// else of this Leaser is queued or in flight (inline), else in the next
// batch. The caller waits for o.done, or stops waiting when ctx ends.
func (l *Leaser) releaseNow(ctx context.Context, o *op) {
	if ctx.Err() == nil && l.inline(ctx, o) {
		return
	}
	l.mu.Lock()
	l.push(o)
	l.mu.Unlock()
}

// inline sends o in a round trip of its own on the caller's goroutine,
// when nothing else of this Leaser is queued or in flight (a lone caller:
// nothing to combine it with), and reports whether it did. A lone caller
// so pays its round trip and no hand-over to a flusher goroutine and back
// (two goroutine wake-ups, measured at about a sixth of a one-row upsert
// each on 2 CPUs). Callers that arrive meanwhile queue, and the next
// batch takes them as before.
//
// A claim goes inline only when ctx has no deadline sooner than the
// Leaser's Timeout: it then waits for its round trip (bounded by that
// Timeout), as a queued claim's caller does unless its ctx ends first. A
// release goes inline under ctx (and the Timeout): when ctx ends while it
// is on its way, its connection is cut, the caller stops waiting, and the
// release is queued and sent again without it (a release is idempotent:
// it marks lapsed only the rows the lease still holds).
func (l *Leaser) inline(ctx context.Context, o *op) bool {
	if o.claim != nil {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < l.timeout {
			return false
		}
	}
	l.mu.Lock()
	if len(l.queue) > 0 || l.flushers > 0 {
		l.mu.Unlock()
		return false
	}
	l.flushers++
	l.seq++
	o.seq = l.seq
	l.pending[o] = struct{}{}
	l.board(o)
	for _, k := range o.release {
		l.releasing[k]++
	}
	l.mu.Unlock()
	var caller context.Context
	if o.claim == nil {
		caller = ctx
	}
	l.send([]*op{o}, caller)
	l.mu.Lock()
	l.flushers--
	l.kick()
	l.mu.Unlock()
	return true
}

// kick makes sure a flusher will send what is queued. The caller holds
// l.mu.
func (l *Leaser) kick() {
	if len(l.queue) > 0 && l.flushers < maxFlushers {
		l.flushers++
		go l.flush()
	}
}

// board marks o as travelling in a batch about to be sent. The caller
// holds l.mu.
func (l *Leaser) board(o *op) {
	if o.claim != nil {
		// A release in the same batch runs before the claim; one in a
		// batch already in flight may not have committed when the claim's
		// statement looks.
		o.raced = l.releasingAny(o.claim)
		o.locked = o.retry || l.contendedAny(o.claim)
	}
	o.state.Store(sent)
}

// contendedFor is how long the claims of a scope in which a claim lost a
// race take the scope lock on their first try: while claims of a scope
// keep arriving together (from other replicas), waiting for the lock
// costs less than losing a race, which costs a round trip (and, for
// SlotClaimTwo and SlotClaim, a failed statement in the server's log).
const contendedFor = time.Second

// contendedAny reports whether a claim of one of c's scopes lost a race
// lately. The caller holds l.mu.
func (l *Leaser) contendedAny(c *Claim) bool {
	if len(l.contended) == 0 {
		return false
	}
	now := time.Now()
	for _, s := range c.Scopes {
		if until, ok := l.contended[s.Key]; ok {
			if now.Before(until) {
				return true
			}
			delete(l.contended, s.Key)
		}
	}
	return false
}

// contend marks c's scopes as contended for contendedFor. The caller holds
// l.mu.
func (l *Leaser) contend(c *Claim) {
	if len(l.contended) >= maxContended {
		clear(l.contended)
	}
	until := time.Now().Add(contendedFor)
	for _, s := range c.Scopes {
		l.contended[s.Key] = until
	}
}

// maxContended bounds the scopes remembered as contended (past it, the
// memory starts again empty: the cost is a race lost again).
const maxContended = 4096

// push is enqueue with l.mu held.
func (l *Leaser) push(o *op) {
	if o.seq == 0 {
		l.seq++
		o.seq = l.seq
	}
	l.pending[o] = struct{}{}
	l.queue = append(l.queue, o)
	l.kick()
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
		l.send(batch, nil)
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
		}
		l.board(o)
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

package nodelimit

import (
	"context"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// bucket is one replica's token bucket for one node, charged when a call
// goes: a call takes its token at the moment Wait lets it go, from the
// bucket as it is at that moment, and never reserves one ahead. So in any
// interval of length L at most burst + limit × L calls go, however late
// the process runs: a replica starved of CPU (or stopped) while calls
// wait lets, when it runs again, at most what the bucket has refilled to,
// the burst, and then one call per 1/limit.
//
// (golang.org/x/time/rate's Wait, which it replaces, reserves a waiting
// call's token for the time it will be due and sleeps until then: when a
// replica starved while calls waited runs again, the calls due meanwhile
// all go at once, on top of a burst its bucket refilled meanwhile. A
// replica of share 2/s stopped for two seconds while four calls waited let
// six go within 500 ms where the bound is three:
// TestStarvedReplicaKeepsToItsShare.)
//
// Callers wait in line: only the first waits for the bucket, the others
// for their turn to be first, so calls go in the order they came.
type bucket struct {
	mu     sync.Mutex
	limit  rate.Limit // tokens per second; rate.Inf: every call goes at once
	burst  int
	tokens float64
	last   time.Time // when tokens was last brought up to date
	line   []*waiter // the calls waiting, in order; line[0] waits for the bucket
}

// waiter is a call in line.
type waiter struct {
	first chan struct{} // closed when it is first in line
	kick  chan struct{} // the limit changed: the first recomputes its wait
}

// newBucket returns a full bucket.
func newBucket(limit rate.Limit, burst int) *bucket {
	return &bucket{limit: limit, burst: burst, tokens: float64(burst), last: time.Now()}
}

// advance brings tokens up to now. b.mu is held.
func (b *bucket) advance(now time.Time) {
	if now.After(b.last) {
		if b.limit != rate.Inf {
			b.tokens += float64(b.limit) * now.Sub(b.last).Seconds()
		}
		b.last = now
	}
	b.tokens = min(b.tokens, float64(b.burst))
}

// take takes a token if there is one now. b.mu is held.
func (b *bucket) take(now time.Time) bool {
	if b.limit == rate.Inf {
		return true
	}
	b.advance(now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// until is how long the bucket takes to earn tokens more. b.mu is held,
// and advance was called.
func (b *bucket) until(tokens float64) time.Duration {
	if b.limit == rate.Inf || tokens <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(tokens / float64(b.limit) * float64(time.Second)))
}

// set changes the limit and the burst, the tokens earned so far at the old
// limit kept (up to the new burst); the first in line recomputes its wait.
func (b *bucket) set(limit rate.Limit, burst int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(time.Now())
	b.limit, b.burst = limit, burst
	b.tokens = min(b.tokens, float64(burst))
	if len(b.line) > 0 {
		select {
		case b.line[0].kick <- struct{}{}:
		default:
		}
	}
}

// get returns the limit and the burst.
func (b *bucket) get() (rate.Limit, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limit, b.burst
}

// errTooLate is a call whose deadline would pass before its turn, known
// when it came: the calls before it in line and its own need more tokens
// than the bucket earns by then.
var errTooLate = context.DeadlineExceeded

// wait waits until the call may go and takes its token then. It returns
// ctx's error when ctx ends first, and errTooLate at once when ctx's
// deadline is sooner than the bucket can have a token for every call in
// line and this one.
func (b *bucket) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	now := time.Now()
	if len(b.line) == 0 && b.take(now) {
		b.mu.Unlock()
		return nil
	}
	b.advance(now)
	if dl, ok := ctx.Deadline(); ok && dl.Before(now.Add(b.until(float64(len(b.line)+1)-b.tokens))) {
		b.mu.Unlock()
		return errTooLate
	}
	w := &waiter{first: make(chan struct{}), kick: make(chan struct{}, 1)}
	b.line = append(b.line, w)
	if len(b.line) == 1 {
		close(w.first)
	}
	b.mu.Unlock()

	select {
	case <-w.first:
	case <-ctx.Done():
		b.leave(w)
		return ctx.Err()
	}
	for {
		b.mu.Lock()
		if b.take(time.Now()) {
			b.leaveLocked(w)
			b.mu.Unlock()
			return nil
		}
		d := b.until(1 - b.tokens)
		b.mu.Unlock()
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-w.kick:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			b.leave(w)
			return ctx.Err()
		}
	}
}

// leave takes w out of line; when it was first, the next is.
func (b *bucket) leave(w *waiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.leaveLocked(w)
}

// leaveLocked is leave with b.mu held.
func (b *bucket) leaveLocked(w *waiter) {
	for i, x := range b.line {
		if x == w {
			b.line = append(b.line[:i], b.line[i+1:]...)
			if i == 0 && len(b.line) > 0 {
				close(b.line[0].first)
			}
			return
		}
	}
}

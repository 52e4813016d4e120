// Remembering: the refusals the database decided, kept until their time and
// forgotten on a reset.

package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// forget drops what this replica remembers of a key (stored form): an
// operator reset it.
func (l *Limiter) forget(key string) {
	l.memory.Forget(key)
	if l.borrow != nil {
		l.borrow.drop(key)
	}
}

func (l *Limiter) forgetAll() {
	l.memory.ForgetAll()
}

// refusal is a refusal remembered (package memo): under GCRA a key's TATs
// only move later until an operator resets the key (other replicas can
// spend more, never less), so a refusal of a key, for a cost and a set of
// policies, holds for every request of that key of that cost or more under
// the same policies until the time the statement named.
type refusal struct {
	policies []Policy
	cost     int
	tats     []time.Time
	clock    clock
}

// clock maps this replica's clock to the database's, from one statement:
// at is its time on the database clock, sent and received when it was sent
// and answered on this replica's (monotonic) clock. The database read its
// clock between the two, so at + (t − sent) is at least the database's
// time at t and at + (t − received) at most.
type clock struct{ at, sent, received time.Time }

// above is the database's time at t, from above: what a borrowed unit is
// judged by, which must never be spent late, and what a remembered refusal
// is judged by and reports (its At and Retry-After): a refusal answered
// from memory holds at every time the database's clock can show, so it is
// never one the database would not have made for this request (judged
// from below it could be up to the statement's way back early: the load
// check on Citus counted such a refusal with room).
func (c clock) above(t time.Time) time.Time { return c.at.Add(t.Sub(c.sent)) }

// below is the database's time at t, from below: what a permit spent from
// a borrowed batch reports as its At.
func (c clock) below(t time.Time) time.Time { return c.at.Add(t.Sub(c.received)) }

// remember keeps a refusal d the database made for a statement sent at
// sent and answered at received, until received + its RetryAfter.
func (l *Limiter) remember(key string, policies []Policy, cost int, d *decision, sent, received time.Time, seq uint64) {
	l.memory.Remember(key, received.Add(d.refusal.RetryAfter),
		&refusal{policies: slices.Clone(policies), cost: cost, tats: d.tats, clock: clock{d.at, sent, received}}, seq)
}

// recall answers a request from a remembered refusal that still holds:
// judged again at the database's time now (from above, see clock) against
// the TATs it returned, which can only have moved later since. Nil when
// nothing remembered holds; gate is the key's gate while it has a refusal
// remembered (see memo.Linger).
func (l *Limiter) recall(key string, cost int, policies []Policy, now time.Time) (*LimitError, *sync.Mutex) {
	e, _, ok, gate := l.memory.Recall(key, now)
	if !ok || cost < e.cost || !slices.Equal(e.policies, policies) {
		return nil, gate
	}
	d, err := l.judge(policies, cost, false, e.clock.above(now), e.tats)
	if err != nil {
		return nil, gate // it no longer holds
	}
	return d.refusal, gate
}

// borrowed counts a decision borrowing made (a permit spent from memory or
// borrowed in a statement, a refusal, an error).
func (l *Limiter) borrowed(ctx context.Context, key string, p *Permit, err error) (*Permit, error) {
	var le *LimitError
	switch {
	case err == nil:
		l.incident.recovered(ctx)
		l.obs.GrantedFromMemory(ctx, scopeKey)
		return p, nil
	case errors.As(err, &le):
		l.incident.recovered(ctx)
		return l.refused(ctx, key, le)
	}
	if !isCanceled(ctx, err) {
		l.incident.failed(ctx, err)
	}
	l.obs.Failed(ctx, scopeKey, err)
	return nil, err
}

// refused counts and returns a refusal, or in dry run logs it and returns
// a Permit that carries it.
func (l *Limiter) refused(ctx context.Context, key string, e *LimitError) (*Permit, error) {
	l.obs.Refused(ctx, scopeKey, key, "violated", e.Violated, "cost", e.Cost, "retry_after", e.RetryAfter)
	if !l.obs.DryRun() {
		return nil, l.toward(ctx, key, e)
	}
	return &Permit{Name: l.name, Policies: e.Policies, At: e.At, refusal: e}, nil
}

// toward counts a refusal of key by the rate (not one of a request that
// can never pass) toward key's ban, with Options.Ban. When it bans the key
// the request is answered as banned; a count that fails is logged and the
// refusal stands.
func (l *Limiter) toward(ctx context.Context, key string, e *LimitError) error {
	if l.bans == nil || e.RetryAfter <= 0 || e.Banned {
		return e
	}
	until, banned, err := l.bans.Refused(ctx, l.qualify(key))
	if err != nil {
		l.errLog.Log(ctx, l.log, slog.LevelWarn, "ratelimit: a refusal was not counted toward its key's ban", "limit", l.name, "err", err)
		return e
	}
	if !banned {
		return e
	}
	return &LimitError{Name: l.name, Banned: true, RetryAfter: max(time.Until(until), time.Microsecond), Cost: e.Cost}
}

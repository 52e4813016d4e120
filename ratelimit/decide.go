// Deciding: a key's policies and cost into one statement's answer, or an answer
// from memory where the database has already decided (memory.go), a share
// (shares.go) or a borrowed unit (borrow.go).

package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/keys"
	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/vocab"
)

// decidedBy is policies as the database decides them: with Options.Shares,
// each less the shares kept apart from it.
func (l *Limiter) decidedBy(policies []Policy) []Policy {
	if l.shares == nil {
		return policies
	}
	return l.shares.reduce(policies)
}

// asConfigured puts policies (the request's, as configured and
// overridden) back into the states and refusal of a decision made by the
// policies the database decided (decidedBy): the headers and the problem
// name the configured policy, and report the state the database holds.
func asConfigured(policies []Policy, states []PolicyState, e *LimitError) {
	for i := range states {
		if i < len(policies) && states[i].Name == policies[i].Name {
			states[i].Policy = policies[i]
		}
	}
	if e != nil {
		for i := range e.Policies {
			if i < len(policies) && e.Policies[i].Name == policies[i].Name {
				e.Policies[i].Policy = policies[i]
			}
		}
		if len(e.Violated) > 0 {
			e.Limit = limitOf(policies, e.Violated[0])
		}
	}
}

// Acquire spends one unit of key's rate under Options.Policies, for
// callers that are not HTTP handlers. It returns a *LimitError when a
// policy has no room (in dry run: a Permit whose Refusal says so).
func (l *Limiter) Acquire(ctx context.Context, key string) (*Permit, error) {
	return l.AcquireN(ctx, key, 1, nil)
}

// AcquireN spends cost units of key's rate under policies (nil:
// Options.Policies), all or nothing. It returns a *LimitError (matching
// pglimit.ErrLimited) when a policy has no room for cost (in dry run: a Permit with Refusal set), an
// error matching ErrInvalidPolicy for policies that cannot be used, and a
// database error (pglimit.Classify tells which) when the decision could
// not be made — with Options.FailOpen, when the database cannot be
// reached or did not answer in time, a Permit that spent nothing and has
// no Policies instead (a caller that went away still gets the error).
func (l *Limiter) AcquireN(ctx context.Context, key string, cost int, policies []Policy) (*Permit, error) {
	p, err := l.acquireN(ctx, key, cost, policies)
	if err != nil && l.failOpen && isUnavailable(err) && !isCanceled(ctx, err) {
		return &Permit{Name: l.name, Cost: 0, At: time.Now()}, nil
	}
	return p, err
}

func (l *Limiter) acquireN(ctx context.Context, key string, cost int, policies []Policy) (*Permit, error) {
	if key == "" {
		return nil, errors.New("ratelimit: empty key")
	}
	if cost < 0 {
		return nil, fmt.Errorf("ratelimit: %w: %d", vocab.ErrInvalidCost, cost)
	}
	if policies == nil {
		policies = l.policies
	} else if err := checkPolicies(policies); err != nil {
		return nil, err
	}
	if len(policies) == 0 {
		return nil, policyError("no policies: Options.Policies is empty")
	}
	dryRun := l.obs.DryRun()
	if l.bans != nil && !dryRun {
		if until, banned := l.bans.Banned(ctx, l.qualify(key)); banned {
			l.obs.BannedFromMemory(ctx, scopeKey)
			return nil, &LimitError{Name: l.name, Banned: true, RetryAfter: max(time.Until(until), time.Microsecond), Cost: cost}
		}
	}
	policies, nothing := l.overridden(key, policies)
	if nothing != nil {
		return l.refused(ctx, key, &LimitError{Name: l.name, Violated: nothing, Limit: 0, Cost: cost})
	}
	// The database decides by decided: policies less their shares.
	decided := l.decidedBy(policies)
	if never := exceedsBurst(decided, cost); never != nil {
		return l.refused(ctx, key, &LimitError{Name: l.name, Violated: never, Limit: limitOf(policies, never[0]), Cost: cost})
	}
	stored := keys.Stored(key)
	now := time.Now()
	if l.shares != nil && l.shares.acquire(stored, cost, policies, now) {
		// From this replica's share of the key: no statement.
		l.obs.GrantedFromMemory(ctx, scopeKey)
		states := make([]PolicyState, len(policies))
		for i, p := range decided {
			states[i] = stateOf(p, now.UnixMicro(), now.UnixMicro()+int64(cost)*p.emission())
			states[i].Policy = policies[i]
		}
		return &Permit{Name: l.name, Cost: cost, Policies: states, At: now, l: l, key: stored, policies: decided, borrowed: true}, nil
	}
	if !dryRun {
		le, gate := l.recall(stored, cost, decided, now)
		if le == nil && gate != nil {
			// The key was refused lately: this replica's statements for it
			// take turns, and each looks again first, so that one asks
			// the database when the refusal lapses.
			gate.Lock()
			defer gate.Unlock()
			now = time.Now()
			le, _ = l.recall(stored, cost, decided, now)
		}
		if le != nil {
			l.obs.RefusedFromMemory(ctx, scopeKey)
			asConfigured(policies, le.Policies, le)
			return nil, l.toward(ctx, key, le)
		}
	}
	if l.borrow != nil && len(decided) == 1 && cost > 0 {
		p, err, done := l.borrow.acquire(ctx, stored, cost, decided[0], decided, now)
		if done {
			var le *LimitError
			if p != nil {
				asConfigured(policies, p.Policies, nil)
			} else if errors.As(err, &le) {
				asConfigured(policies, le.Policies, le)
			}
			return l.borrowed(ctx, key, p, err)
		}
	}
	seq := l.memory.Seq()
	start := time.Now()
	d, err := l.decide(ctx, stored, cost, decided)
	received := time.Now()
	l.obs.Took(ctx, observe.Check, start)
	if err != nil {
		if !isCanceled(ctx, err) {
			l.incident.failed(ctx, err)
		}
		l.obs.Failed(ctx, scopeKey, err)
		return nil, err
	}
	l.incident.recovered(ctx)
	if d.refusal != nil {
		if !dryRun {
			l.remember(stored, decided, cost, d, start, received, seq)
		}
		if l.shares != nil {
			// A refusal remembered keeps the policies it was decided by;
			// the one returned names the configured ones.
			e := *d.refusal
			e.Policies = slices.Clone(e.Policies)
			asConfigured(policies, e.Policies, &e)
			return l.refused(ctx, key, &e)
		}
		return l.refused(ctx, key, d.refusal)
	}
	l.obs.Granted(ctx, scopeKey)
	if l.shares != nil {
		asConfigured(policies, d.states, nil)
	}
	return &Permit{Name: l.name, Cost: cost, Policies: d.states, At: d.at, l: l, key: stored, policies: decided, tats: d.tats}, nil
}

// overridden returns policies with the limits Options.Overrides gives key
// (policies itself when none applies), and the names of the policies
// whose override allows nothing.
func (l *Limiter) overridden(key string, policies []Policy) ([]Policy, []string) {
	if l.over == nil {
		return policies, nil
	}
	qualified := l.qualify(key)
	var out []Policy
	var nothing []string
	for i, p := range policies {
		n, ok := l.over.Limit(p.Name, qualified)
		if !ok || n == int64(p.Limit) {
			continue
		}
		if out == nil {
			out = slices.Clone(policies)
		}
		if n == 0 {
			nothing = append(nothing, p.Name)
			continue
		}
		out[i] = p.withLimit(int(min(n, maxUnits)))
	}
	if out == nil {
		return policies, nil
	}
	return out, nothing
}

// exceedsBurst names the policies whose Burst is below cost: a request of
// that cost can never pass them.
func exceedsBurst(ps []Policy, cost int) []string {
	var names []string
	for _, p := range ps {
		if cost > p.burst() {
			names = append(names, p.Name)
		}
	}
	return names
}

func limitOf(ps []Policy, name string) int {
	for _, p := range ps {
		if p.Name == name {
			return p.Limit
		}
	}
	return 0
}

// decision is what one statement decided, seen from Go.
type decision struct {
	at      time.Time
	states  []PolicyState
	tats    []time.Time
	refusal *LimitError
}

// decide runs the decision's statement: APIRequestWindowDecideOne for one
// policy (on Citus APIRequestWindowDecideOneOnShard), and
// APIRequestWindowDecide (on Citus the function pglimit.rate_decide) for
// several or when the key's row holds other policies too.
func (l *Limiter) decide(ctx context.Context, key string, cost int, policies []Policy) (*decision, error) {
	ctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	defer cancel()
	d, err := l.decideOn(ctx, key, cost, policies)
	// A decision stopped by the limiter's own Timeout is a database that
	// did not answer in time (pglimit.ClassUnavailable).
	return d, dberr.OwnTimeout(ctx, err)
}

func (l *Limiter) decideOn(ctx context.Context, key string, cost int, policies []Policy) (*decision, error) {
	onShard, err := l.citus.On(ctx, l.pool)
	if err != nil {
		return nil, err
	}
	if len(policies) == 1 && !l.generalOnly {
		p := policies[0]
		arg := &db.APIRequestWindowDecideOneParams{
			Name: l.name, Key: key, Policy: p.Name,
			Increment: micros(p.emission() * int64(cost)), Tolerance: micros(p.emission() * int64(p.burst())),
		}
		var row *db.APIRequestWindowDecideOneRow
		if onShard {
			var r *db.APIRequestWindowDecideOneOnShardRow
			if r, err = l.q.APIRequestWindowDecideOneOnShard(ctx, l.pool, (*db.APIRequestWindowDecideOneOnShardParams)(arg)); err == nil {
				row = (*db.APIRequestWindowDecideOneRow)(r)
			}
		} else {
			row, err = l.q.APIRequestWindowDecideOne(ctx, l.pool, arg)
		}
		switch {
		case err == nil:
			return l.judge(policies, cost, row.Allowed, row.DecidedAt, []time.Time{row.Tat})
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, err
		}
	}
	arg := &db.APIRequestWindowDecideParams{Name: l.name, Key: key,
		Policies:   make([]string, len(policies)),
		Increments: make([]pgtype.Interval, len(policies)),
		Tolerances: make([]pgtype.Interval, len(policies)),
	}
	for i, p := range policies {
		arg.Policies[i] = p.Name
		arg.Increments[i] = micros(p.emission() * int64(cost))
		arg.Tolerances[i] = micros(p.emission() * int64(p.burst()))
	}
	var row *db.APIRequestWindowDecideRow
	if onShard {
		r, err := l.q.APIRequestWindowDecideOnShard(ctx, l.pool, (*db.APIRequestWindowDecideOnShardParams)(arg))
		if err != nil {
			return nil, err
		}
		row = (*db.APIRequestWindowDecideRow)(r)
	} else if row, err = l.q.APIRequestWindowDecide(ctx, l.pool, arg); err != nil {
		return nil, err
	}
	tats := make([]time.Time, len(policies))
	for i, p := range policies {
		if j := slices.Index(row.Policies, p.Name); j >= 0 && j < len(row.Tats) {
			tats[i] = row.Tats[j]
		}
	}
	return l.judge(policies, cost, row.Allowed, row.DecidedAt, tats)
}

func micros(us int64) pgtype.Interval { return pgtype.Interval{Microseconds: us, Valid: true} }

// judge derives each policy's state from the TATs the statement returned
// (after the request when it was allowed, before it when refused; the
// zero time for a policy the key has no state in) and the time of the
// decision. For a refusal it names the policies without room and the
// time until the request fits: the longest of theirs.
func (l *Limiter) judge(policies []Policy, cost int, allowed bool, at time.Time, tats []time.Time) (*decision, error) {
	now := at.UnixMicro()
	// One allocation for the common case of one policy: the decision, its
	// state, and a refusal's error and violated name.
	var d *decision
	if len(policies) == 1 {
		one := &judgedOne{}
		one.d.states = one.states[:]
		one.d.refusal = &one.le
		one.le.Violated = one.violated[:0]
		d = &one.d
	} else {
		d = &decision{states: make([]PolicyState, len(policies)), refusal: &LimitError{}}
	}
	d.at, d.tats = at, tats
	violated := d.refusal.Violated
	var retry int64
	for i, p := range policies {
		var tat int64
		if !tats[i].IsZero() {
			tat = tats[i].UnixMicro()
		}
		d.states[i] = stateOf(p, now, tat)
		if !allowed {
			t := p.emission()
			if over := max(now, tat) + t*int64(cost) - t*int64(p.burst()) - now; over > 0 {
				violated = append(violated, p.Name)
				retry = max(retry, over)
			}
		}
	}
	if allowed {
		d.refusal = nil
		return d, nil
	}
	if len(violated) == 0 {
		return nil, fmt.Errorf("ratelimit: the database refused a request its returned state admits (policies %v at %v)", names(policies), at)
	}
	*d.refusal = LimitError{Name: l.name, Violated: violated, Limit: limitOf(policies, violated[0]),
		RetryAfter: time.Duration(retry) * time.Microsecond, Cost: cost, Policies: d.states, At: at}
	return d, nil
}

// judgedOne is a decision under one policy, allocated at once.
type judgedOne struct {
	d        decision
	states   [1]PolicyState
	le       LimitError
	violated [1]string
}

// stateOf is policy p's state at now (µs) for a key whose TAT is tat (µs;
// 0: none).
func stateOf(p Policy, now, tat int64) PolicyState {
	t := p.emission()
	burst := int64(p.burst())
	tol := t * burst
	base := max(now, tat)
	avail := max(now+tol-base, 0) // µs of burst left
	remaining := min(avail/t, burst)
	var reset int64
	if base > now {
		reset = (remaining+1)*t - avail
	}
	return PolicyState{Policy: p, Remaining: int(remaining), Reset: time.Duration(reset) * time.Microsecond}
}

func names(ps []Policy) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

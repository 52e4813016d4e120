// Settling: what a decision admitted, and the cost known after the request.

package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/vocab"
)

// PolicyState is one policy of a decision and the key's state in it.
type PolicyState struct {
	Policy
	// Remaining is the units the key may spend at once now (the header's
	// r): after the request when it was admitted, before it when refused.
	Remaining int
	// Reset is the time until one more unit is available (the header's t,
	// rounded up to whole seconds); 0 when the key has spent nothing.
	Reset time.Duration
}

// Permit is an admitted request: the decision, made at At on the
// database clock, and the state of each policy after it. Release is a
// no-op: a rate is spent when it is granted; Settle charges the
// difference when the request's actual cost is known only after it. A
// Permit is not safe for concurrent use.
type Permit struct {
	// Name is the limiter's name.
	Name string
	// Cost is the units the request spent (0 in dry run when Refusal is
	// not nil); after Settle, its actual cost.
	Cost int
	// Policies are the request's policies, in its order.
	Policies []PolicyState
	// At is when the decision was made, on the database clock.
	At time.Time

	refusal *LimitError
	// For Settle: the Limiter (nil for a dry-run refusal, which spent
	// nothing), the key as stored, the policies the request was judged
	// by (its overrides applied), the TATs the admission left (nil when it
	// was spent from a borrowed batch: borrowed), and whether it was
	// settled.
	l        *Limiter
	key      string
	policies []Policy
	tats     []time.Time
	borrowed bool
	settled  bool
}

// maxSettle bounds what a settle may move a policy's TAT, in
// microseconds: about 290,000 years, far inside PostgreSQL's interval
// and clear of int64 overflow.
const maxSettle = math.MaxInt64 / 1000

// Settle charges the difference between actual and the Cost the permit
// was admitted at, once the request's actual cost is known (rows exported,
// tokens generated, bytes stored): AcquireN reserves an estimate before
// the work, Settle corrects it after. A further charge, when the work cost
// more, is made whatever the room — the work is done — so the key is
// refused the longer; a refund, when it cost less, is given back while no
// other decision has spent on the key since this one (then every replica
// is told to forget the key's remembered refusals, which the refund may
// have undone), and otherwise its units lapse on their own, as they do
// for a permit spent from a borrowed batch (Options.Borrow), which never
// refunds. The bound: in any interval of length L a key's actual units
// stay within Burst + Limit × L / Window plus, over its permits admitted
// and not yet settled, what each settles above its estimate (with
// settles that never exceed their estimate, within the policy's bound).
// A second Settle returns pglimit.ErrSettled; a negative actual an error
// matching pglimit.ErrInvalidCost; a database that could not write it an error
// (pglimit.Classify), and the estimate stands. The settle outlives ctx's
// cancellation, bounded by Options.Timeout. A dry-run refusal's permit
// spent nothing and settles nothing.
func (p *Permit) Settle(ctx context.Context, actual int) error {
	if actual < 0 {
		return fmt.Errorf("ratelimit: %w: settle of %d", vocab.ErrInvalidCost, actual)
	}
	if p.settled {
		return vocab.ErrSettled
	}
	delta := actual - p.Cost
	for _, pol := range p.policies {
		if t := pol.emission(); int64(delta) > maxSettle/t || int64(delta) < -maxSettle/t {
			return fmt.Errorf("ratelimit: %w: settle of %d under policy %s", vocab.ErrInvalidCost, actual, pol.Name)
		}
	}
	p.settled = true
	if delta == 0 || p.l == nil || delta < 0 && p.borrowed {
		if p.l != nil {
			p.Cost = actual
		}
		return nil
	}
	if err := p.l.settle(ctx, p, delta); err != nil {
		p.settled = false
		return err
	}
	p.Cost = actual
	return nil
}

// settle runs APIRequestWindowSettle for p, delta units more (or, less
// than 0, fewer) than it was admitted at, and updates p's states.
func (l *Limiter) settle(ctx context.Context, p *Permit, delta int) error {
	ctx, cancel := dberr.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	arg := &db.APIRequestWindowSettleParams{Name: l.name, Key: p.key, Tats: p.tats,
		Policies: make([]string, len(p.policies)), Deltas: make([]pgtype.Interval, len(p.policies))}
	for i, pol := range p.policies {
		arg.Policies[i] = pol.Name
		arg.Deltas[i] = micros(pol.emission() * int64(delta))
	}
	if arg.Tats == nil {
		arg.Tats = []time.Time{}
	}
	start := time.Now()
	row, err := l.q.APIRequestWindowSettle(ctx, l.pool, arg)
	l.obs.Took(ctx, observe.Record, start)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // a refund after another decision spent, or a row that lapsed
	}
	if err != nil {
		return fmt.Errorf("ratelimit: settle: %w", dberr.OwnTimeout(ctx, err))
	}
	if delta < 0 {
		// The same invalidation as Reset's, so that a refusal decided
		// before it is never remembered after it (memo's sequence): it
		// also drops the key's batches other replicas borrowed, whose
		// units then lapse (the safe direction; a refund comes from a
		// permit not spent from a batch, of a key cool on this replica).
		if err := l.q.BusNotify(ctx, l.pool, bus.TopicRate+l.name+"\n"+p.key); err != nil {
			l.errLog.Log(ctx, l.log, slog.LevelWarn, "ratelimit: the replicas were not told of a refund; they refuse the key from memory until their refusal lapses",
				"limit", l.name, "err", err)
		}
	}
	for i, pol := range p.policies {
		if j := slices.Index(row.Policies, pol.Name); j >= 0 && j < len(row.Tats) && i < len(p.Policies) {
			p.Policies[i] = stateOf(pol, row.DecidedAt.UnixMicro(), row.Tats[j].UnixMicro())
		}
	}
	return nil
}

// Refusal is, in dry run, the refusal the decision would have been
// without it (the request was let through and spent nothing); nil when
// the request fits.
func (p *Permit) Refusal() *LimitError { return p.refusal }

// Release does nothing and returns nil: a rate is spent when it is
// granted and never given back. It exists so that every pglimit permit
// is released the same way.
func (p *Permit) Release(context.Context) error { return nil }

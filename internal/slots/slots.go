// Package slots is the core the slot limiters — middleware/heavy,
// middleware/inflight and middleware/upload — are thin over: the options
// they share, checked the same way, the claim of a permit.Leaser with its
// metrics, dry run and refusal, the held slot a Permit wraps, and the
// failure path of a Handler. What differs between the three (the scopes,
// the lease, what a refusal says, what the Handler does around next) stays
// in each package.
package slots

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/permit"
	"github.com/pglimit/pglimit/internal/vocab"
)

// DefaultTimeout is the default Options.Timeout of every slot limiter.
const DefaultTimeout = 5 * time.Second

// Config is what a slot limiter's New hands the core: the shared fields of
// its Options, and what the package sets itself.
type Config struct {
	// Pkg prefixes the errors ("heavy", "inflight", "upload").
	Pkg string
	// Name is the limit's name.
	Name string
	// Kind is the kind of slots (permit.HeavyPermit, ...).
	Kind permit.Kind
	// Scopes are the kinds of scope its decisions are counted in (the
	// first is a grant's).
	Scopes []string
	// The fields of the package's Options of the same names.
	Replica       string
	Timeout       time.Duration
	Logger        *slog.Logger
	MeterProvider metric.MeterProvider
	DryRun        bool
	// Keep, when positive, keeps the slot of a claim in one scope for up
	// to Keep after its release, for the scope's next claim on this
	// replica (see keep.go). Negative is an error.
	Keep time.Duration
	// Shares, when positive, keeps that many slots of every scope apart,
	// one per share, for requests run on a share in memory (see
	// shares.go); Linger is the slots' longest lease (a request's longest
	// life and the grace). Claims in one scope only; not with Keep.
	Shares int
	Linger time.Duration
}

// Limiter is the core of one slot limiter. It is safe for concurrent use.
type Limiter struct {
	Pkg, Name string
	Log       *slog.Logger
	leaser    *permit.Leaser
	obs       *observe.Limit
	scope     string
	keeper    *keeper     // nil without Keep
	shares    *slotShares // nil without Shares
	timeout   time.Duration
}

// Check checks the options every slot limiter shares (a nil pool, a
// negative Timeout or Keep, or one above vocab.MaxDuration) and fills
// their defaults: the slot limiter's
// New calls it, once, and New trusts what it left.
func Check(pool *pgxpool.Pool, c *Config) error {
	if pool == nil {
		return fmt.Errorf("%s: nil pool", c.Pkg)
	}
	if err := errors.Join(vocab.OrDefault(c.Pkg, "Timeout", &c.Timeout, DefaultTimeout),
		vocab.OrDefault(c.Pkg, "Keep", &c.Keep, 0)); err != nil {
		return err
	}
	if c.Timeout > vocab.MaxDuration || c.Keep > vocab.MaxDuration {
		return fmt.Errorf("%s: Timeout %v or Keep %v above 366 days", c.Pkg, c.Timeout, c.Keep)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// New makes the limiter's metrics and Leaser of c, which Check has
// checked.
func New(pool *pgxpool.Pool, c Config) (*Limiter, error) {
	obs, err := observe.New(observe.Options{Name: c.Name, Scopes: c.Scopes, DryRun: c.DryRun,
		MeterProvider: c.MeterProvider, Logger: c.Logger, DB: pool, Timeout: c.Timeout})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Pkg, err)
	}
	leaser := permit.New(pool, permit.Options{Kind: c.Kind, Replica: c.Replica, Timeout: c.Timeout,
		Logger: c.Logger, OnRelease: obs.Released})
	l := &Limiter{Pkg: c.Pkg, Name: c.Name, Log: c.Logger, leaser: leaser, obs: obs, scope: c.Scopes[0], timeout: c.Timeout}
	if c.Keep > 0 {
		l.keeper = newKeeper(l, pool, c.Kind, c.Keep, c.Timeout)
	} else if c.Shares > 0 && !c.DryRun {
		l.shares = newSlotShares(l, pool, c.Kind, c.Shares, c.Linger, c.Timeout)
	}
	return l, nil
}

// Refused is a claim the scopes had no room for: the package makes its
// *limit.Refusal of it.
type Refused = permit.RefusedError

// Claim claims c for key and counts the decision. On a refusal it returns
// the Leaser's refusal, whose Scope names the full scope (counted under
// its Kind), and whether to let the request through anyway (dry run; args
// are logged); any other error is the database's or ctx's.
func (l *Limiter) Claim(ctx context.Context, key string, c permit.Claim, args ...any) (held Held, refused *Refused, letThrough bool, err error) {
	if key == "" {
		return Held{}, nil, false, fmt.Errorf("%s: empty key", l.Pkg)
	}
	if l.keeper != nil && len(c.Scopes) == 1 {
		return l.claimKept(ctx, key, c, args...)
	}
	if l.shares != nil && len(c.Scopes) == 1 {
		return l.claimShared(ctx, key, c, args...)
	}
	start := time.Now()
	lease, err := l.leaser.Claim(ctx, c)
	l.obs.Took(ctx, observe.Claim, start)
	if err != nil {
		return l.notGranted(ctx, key, err, args...)
	}
	l.obs.Granted(ctx, l.scope)
	return Held{lease: lease}, nil, false, nil
}

// notGranted counts a claim that failed with err: a refusal (in its
// scope's Kind; let through in dry run) or another error (the database's
// or ctx's).
func (l *Limiter) notGranted(ctx context.Context, key string, err error, args ...any) (Held, *Refused, bool, error) {
	var refused *Refused
	if !errors.As(err, &refused) {
		l.obs.Failed(ctx, l.scope, err)
		return Held{}, nil, false, err
	}
	l.obs.Refused(ctx, refused.Scope.Kind, key, args...)
	return Held{}, refused, l.obs.DryRun(), nil
}

// Flush waits until every slot released so far has reached the database
// (permit.Leaser.Flush); with Keep, it first gives back every idle kept
// slot, in one statement.
func (l *Limiter) Flush(ctx context.Context) error {
	if l.shares != nil {
		if err := l.shares.flush(ctx); err != nil {
			return err
		}
	}
	if l.keeper != nil {
		if err := l.keeper.flush(ctx); err != nil {
			return err
		}
	}
	return l.leaser.Flush(ctx)
}

// Failed logs a claim that failed for another reason than a refusal (a
// refusal is no incident); the transport then answers it.
func (l *Limiter) Failed(ctx context.Context, err error) {
	if !errors.Is(err, vocab.ErrLimited) {
		vocab.LogFailure(ctx, l.Log, l.Pkg+": claim failed", err, "limit", l.Name)
	}
}

// Held is the slots a Permit holds; the zero Held holds none (a dry-run
// refusal).
type Held struct {
	lease *permit.Lease
	kept  *kept      // the slot as kept, with Keep
	gen   uint64     // the request of kept this is
	local *localSlot // a request run on a share, with Shares: no row
}

// Release gives the slots back and waits until the database has them, or
// ctx ends (permit.Lease.Release); with Keep, a slot kept for the scope's
// next claim stays held by this replica and Release returns at once. It
// is safe on the zero Held and more than once.
func (h Held) Release(ctx context.Context) error {
	if h.local != nil {
		h.local.release()
		return nil
	}
	if _, ok := ctx.Value(answerKey{}).(*answer); ok {
		// A release on a context that carries an answer (Answer: the gRPC
		// front's calls, through limit.Permit.Release) is that answer's.
		h.ReleaseBeforeAnswer(ctx)
		return nil
	}
	if h.lease == nil || h.kept != nil && h.kept.k.put(h.kept, h.gen) {
		return nil
	}
	return h.lease.Release(ctx)
}

// Outcome is what a slot limiter's acquire returns of a Claim's result:
// the held slots when granted; in dry run, the refusal (refusal of the
// Leaser's, R a *limit.Refusal) let through with nothing held; otherwise
// the refusal, or the Claim's error, as the error.
func Outcome[R error](held Held, refused *Refused, letThrough bool, err error, refusal func(*Refused) R) (Held, R, error) {
	var none R
	switch {
	case err != nil:
		return Held{}, none, err
	case refused == nil:
		return held, none, nil
	}
	r := refusal(refused)
	if !letThrough {
		return Held{}, none, r
	}
	return Held{}, r, nil
}

// ReleaseFunc is what a slot limiter's Permit releases (limit.NewPermit's
// release): h's Release, or nil when h holds nothing (a dry run's
// refusal let through).
func (h Held) ReleaseFunc() func(context.Context) error {
	if h.lease == nil && h.local == nil {
		return nil
	}
	return h.Release
}

// Grace is added to a request's longest life (heavy: an endpoint's time
// bound; inflight: MaxDuration) to make its slot's lease: a slot whose
// holder vanished lapses that long after the bound.
const Grace = 30 * time.Second

// answerKey is the context key of a request's answer (Answer).
type answerKey struct{}

// answer is what the slot Handlers around one request (an in-flight slot,
// a heavy permit, an upload slot, nested) share of its answer.
type answer struct {
	// client is the request's context as the outermost of them got it: it
	// ends when the client goes away, never at an inner Handler's bound.
	client context.Context
	// late: a release of this answer did not land within its wait (the
	// database does not answer within the Timeout), so the answer waits for
	// no other release: a database that hangs delays it by one wait, not
	// one per Handler.
	late atomic.Bool
}

// Answer returns ctx carrying the answer of its request, the one an outer
// slot Handler put there or a new one: a Handler passes it to next (and
// derives next's context from it) and releases with it
// (Held.ReleaseBeforeAnswer).
func Answer(ctx context.Context) context.Context {
	if _, ok := ctx.Value(answerKey{}).(*answer); ok {
		return ctx
	}
	return context.WithValue(ctx, answerKey{}, &answer{client: ctx})
}

// ReleaseBeforeAnswer is a Handler's release before the answer completes,
// with ctx from Answer: the answer waits until the release has landed, in
// its own round trip or in the batch that carries it, for as long as the
// database answers within the Timeout (permit.Lease.ReleaseBeforeAnswer),
// so that a client that reads the answer before it sends its next request
// is never refused by its own slot; it stops waiting when the client goes
// away. When a release of the same answer did not land within its wait,
// the database is not answering: this one is sent without waiting. A
// failure is logged by the Leaser. With Keep, a slot kept for the scope's
// next claim costs no statement and no wait.
func (h Held) ReleaseBeforeAnswer(ctx context.Context) {
	if h.local != nil {
		h.local.release()
		return
	}
	if h.lease == nil || h.kept != nil && h.kept.k.put(h.kept, h.gen) {
		return
	}
	a, _ := ctx.Value(answerKey{}).(*answer)
	if a == nil {
		a = &answer{client: ctx}
	}
	if a.late.Load() {
		_ = h.lease.ReleaseWithin(a.client, 0)
		return
	}
	if err := h.lease.ReleaseBeforeAnswer(a.client); err != nil && a.client.Err() == nil {
		a.late.Store(true)
	}
}

// RetryAfter is a refusal's wait: until the first slot of the refusing
// scope lapses, less grace (the slot's holder ends its work by then), at
// least a second.
func RetryAfter(r *Refused, grace time.Duration) time.Duration {
	return max(time.Second, r.FirstLapse-grace)
}

// leaserTimeout is the Timeout of the limiter's statements.
func (l *Limiter) leaserTimeout() time.Duration { return l.timeout }

// claimShared is Claim with Shares: a request of the scope runs on this
// replica's share when it may (no statement); otherwise it is claimed in
// the database against the Cap less the shares still reserved for the
// scope, and, refused while shares still hold the scope, once more after
// asking them to give it up.
func (l *Limiter) claimShared(ctx context.Context, key string, c permit.Claim, args ...any) (Held, *Refused, bool, error) {
	s := l.shares
	scope := c.Scopes[0]
	now := time.Now()
	if h, ok := s.take(scope.Key, now); ok {
		l.obs.GrantedFromMemory(ctx, l.scope)
		return h, nil, false, nil
	}
	for try := 0; ; try++ {
		reserved := s.reserved(scope.Key, time.Now())
		claim := c
		claim.Scopes = []permit.Scope{scope}
		claim.Scopes[0].Cap = scope.Cap - reserved
		var lease *permit.Lease
		err := error(&Refused{Scope: scope, FirstLapse: time.Second})
		if claim.Scopes[0].Cap >= 1 {
			start := time.Now()
			lease, err = l.leaser.Claim(ctx, claim)
			l.obs.Took(ctx, observe.Claim, start)
		}
		var refused *Refused
		if errors.As(err, &refused) && reserved > 0 && try == 0 {
			s.revoke(ctx, scope.Key)
			continue
		}
		if err != nil {
			if errors.As(err, &refused) {
				refused.Scope.Cap = scope.Cap
			}
			return l.notGranted(ctx, key, err, args...)
		}
		l.obs.Granted(ctx, l.scope)
		return Held{lease: lease}, nil, false, nil
	}
}

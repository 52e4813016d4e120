// Package throttle is the failed sign-in throttle's engine, without
// net/http: the reservation (strict) or the read (lenient) of an attempt,
// its failure, success and give-back, an operator's reset, and the
// refusals answered from memory. middleware/signin is its HTTP transport
// (the key taken from a request, the Handler, the problem answers) and
// documents the rule; this package decides it.
//
// Keys are what the transport stores (keys.Stored applied here). Every
// write runs on the pool as a statement of its own.
package throttle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/keys"
	"github.com/pglimit/pglimit/internal/memo"
	"github.com/pglimit/pglimit/internal/observe"
)

// Config is what a Limiter decides by; the transport checks and defaults
// it (every field is used as it is).
type Config struct {
	// Name is the limit's name, in log lines and metrics.
	Name string
	// Kind is the kind of scope of the decisions (attribute scope of the
	// metrics): "user" for a username's, "key" for an address's.
	Kind string
	// KeepOnSuccess: a success gives back its own attempt and clears
	// nothing (an address's throttle).
	KeepOnSuccess bool
	// Limit is the failures that throttle a key; Window how long they
	// count.
	Limit  int
	Window time.Duration
	// Strict reserves each attempt before its password is checked;
	// otherwise the count is read before and a failure written after.
	Strict bool
	// Timeout bounds each statement when the caller's context has no
	// sooner deadline.
	Timeout       time.Duration
	Logger        *slog.Logger
	MeterProvider metric.MeterProvider
	DryRun        bool
}

// Limiter decides failed sign-ins. It is safe for concurrent use.
type Limiter struct {
	pool *pgxpool.Pool
	q    *db.Queries
	c    Config
	log  *slog.Logger
	obs  *observe.Limit
	// memory answers throttled keys until their windows end.
	sub    *bus.Subscription
	memory *memo.Table[int32]
}

// New returns a Limiter counting failures in pool's database; it starts
// nothing.
func New(pool *pgxpool.Pool, c Config) (*Limiter, error) {
	obs, err := observe.New(observe.Options{Name: c.Name, Scopes: []string{c.Kind}, DryRun: c.DryRun,
		MeterProvider: c.MeterProvider, Logger: c.Logger, DB: pool, Timeout: c.Timeout})
	if err != nil {
		return nil, err
	}
	l := &Limiter{pool: pool, q: db.New(), c: c, log: c.Logger, obs: obs}
	b := bus.For(pool)
	l.sub = b.Subscribe(bus.TopicSignIn, func(key string) { l.memory.Forget(key) }, func() { l.memory.ForgetAll() })
	l.memory = memo.New[int32](b, l.sub)
	return l, nil
}

// Refused is a throttled key.
type Refused struct {
	// Failures is the key's failures in its window.
	Failures int
	// RetryAfter is when the window lapses, on the database clock, at
	// least one second.
	RetryAfter time.Duration

	// window is the time left of the key's window as the database read
	// it (RetryAfter before its floor), so the refusal may be remembered
	// that long; 0 for the refusal of a row that kept changing.
	window time.Duration
}

func (r *Refused) Error() string {
	return fmt.Sprintf("throttle: %d failed sign-ins; retry in %v", r.Failures, r.RetryAfter)
}

// Attempt is one sign-in attempt the throttle let through. Report how it
// ended with exactly one of Fail, Succeed or Release, once (the transport
// keeps the first report).
type Attempt struct {
	l        *Limiter
	key      string
	prior    int32    // live failures the read saw (lenient, and a dry-run refusal)
	reserved bool     // the attempt was reserved (strict)
	refusal  *Refused // dry run: the refusal the attempt would have had
}

// Refusal is, in dry run, the refusal this attempt would have had; nil
// when it fits.
func (a *Attempt) Refusal() *Refused { return a.refusal }

// Exempted counts a sign-in let through uncounted (outcome exempt).
func (l *Limiter) Exempted(ctx context.Context) { l.obs.Exempted(ctx, l.c.Kind) }

// Failed logs a check that failed for another reason than a refusal.
func (l *Limiter) Failed(ctx context.Context, err error) { l.obs.Failed(ctx, l.c.Kind, err) }

// Acquire begins a sign-in attempt of key (not empty). A throttled key is
// a *Refused (in dry run an Attempt whose Refusal says so); any other error
// is the database's or ctx's.
func (l *Limiter) Acquire(ctx context.Context, key string) (*Attempt, error) {
	key = keys.Stored(key)
	dryRun := l.obs.DryRun()
	if !dryRun {
		r, gate := l.recall(key)
		if r == nil && gate != nil {
			// The key was throttled lately: this replica's statements for
			// it take turns, and each looks again first.
			gate.Lock()
			defer gate.Unlock()
			r, _ = l.recall(key)
		}
		if r != nil {
			l.obs.RefusedFromMemory(ctx, l.c.Kind)
			return nil, r
		}
	}
	ctx, cancel := dberr.WithTimeout(ctx, l.c.Timeout)
	defer cancel()
	seq := l.memory.Seq()
	start := time.Now()
	a, err := l.acquire(ctx, key)
	l.obs.Took(ctx, observe.Check, start)
	err = dberr.OwnTimeout(ctx, err)
	var r *Refused
	switch {
	case errors.As(err, &r):
		if !dryRun && r.window > 0 {
			// The window ends RetryAfter after the statement read the
			// database's clock, which it did after start: until
			// start + RetryAfter the key is throttled on every replica
			// (retry_ms is rounded up: less a millisecond).
			l.memory.Remember(key, start.Add(r.window-time.Millisecond), int32(r.Failures), seq)
		}
		l.obs.Refused(ctx, l.c.Kind, key, "failures", r.Failures)
		if !dryRun {
			return nil, err
		}
		// Dry run: the attempt goes on unreserved; a failure is recorded
		// and a success clears the key, as for any other.
		return &Attempt{l: l, key: key, prior: int32(r.Failures), refusal: r}, nil
	case err != nil:
		l.obs.Failed(ctx, l.c.Kind, err)
		return nil, err
	}
	l.obs.Granted(ctx, l.c.Kind)
	return a, nil
}

// recall answers a sign-in of a key remembered as throttled; gate is the
// key's gate while it has a refusal remembered (see memo.Linger).
func (l *Limiter) recall(key string) (*Refused, *sync.Mutex) {
	now := time.Now()
	failures, until, ok, gate := l.memory.Recall(key, now)
	if !ok {
		return nil, gate
	}
	return &Refused{Failures: int(failures), RetryAfter: max(time.Second, until.Sub(now))}, gate
}

// Reset clears key's failed sign-ins on every replica (its row goes, then
// a notification) and returns the failures it had.
func (l *Limiter) Reset(ctx context.Context, key string) (int, error) {
	ctx, cancel := dberr.WithTimeout(ctx, l.c.Timeout)
	defer cancel()
	key = keys.Stored(key)
	had, err := l.q.LoginAttemptClear(ctx, l.pool, key)
	if err != nil {
		return 0, fmt.Errorf("reset: %w", dberr.OwnTimeout(ctx, err))
	}
	if err := l.notify(ctx, key); err != nil {
		return 0, fmt.Errorf("reset: the replicas were not told: %w", dberr.OwnTimeout(ctx, err))
	}
	n := 0
	for _, f := range had {
		n += int(f)
	}
	return n, nil
}

// ResetPrefix clears the failed sign-ins of every key that starts with
// prefix on every replica (their rows go, then a notification for each key
// that had reached the limit) and returns the failures they had. prefix is
// stored keys' form: a key longer than keys.Stored keeps is stored as its
// digest, which no prefix matches (it lapses with its window).
func (l *Limiter) ResetPrefix(ctx context.Context, prefix string) (int, error) {
	if prefix == "" {
		return 0, errors.New("reset: empty prefix")
	}
	ctx, cancel := dberr.WithTimeout(ctx, l.c.Timeout)
	defer cancel()
	rows, err := l.q.LoginAttemptClearPrefix(ctx, l.pool, prefix)
	if err != nil {
		return 0, fmt.Errorf("reset: %w", dberr.OwnTimeout(ctx, err))
	}
	n := 0
	for _, row := range rows {
		n += int(row.Failures)
		if int(row.Failures) < l.c.Limit {
			continue
		}
		if err := l.notify(ctx, row.Key); err != nil {
			return n, fmt.Errorf("reset: the replicas were not told: %w", dberr.OwnTimeout(ctx, err))
		}
	}
	return n, nil
}

// notify tells every replica to forget what it remembers of key
// (BusNotify): a write just lowered its count.
func (l *Limiter) notify(ctx context.Context, key string) error {
	return l.q.BusNotify(ctx, l.pool, bus.TopicSignIn+"\n"+key)
}

// notifyAfter tells every replica to forget key when the write that lowered
// its count may have undone a refusal one remembers: the key had reached
// the limit before it (had are the failures it had). A notification that
// fails is logged: other replicas then refuse the key until its window
// ends, as the database would have before the write.
func (l *Limiter) notifyAfter(ctx context.Context, key string, had []int32) {
	for _, f := range had {
		if int(f) >= l.c.Limit {
			if err := l.notify(ctx, key); err != nil {
				l.log.WarnContext(ctx, "signin: the replicas were not told that a key's failures went down", "limit", l.c.Name, "err", err)
			}
			return
		}
	}
}

func (l *Limiter) acquire(ctx context.Context, key string) (*Attempt, error) {
	if l.c.Strict {
		return l.reserve(ctx, key)
	}
	row, err := l.q.LoginAttemptGet(ctx, l.pool, key)
	if errors.Is(err, pgx.ErrNoRows) {
		return &Attempt{l: l, key: key}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read throttle: %w", err)
	}
	if int(row.Failures) >= l.c.Limit {
		return nil, refused(row.Failures, row.RetryMs)
	}
	return &Attempt{l: l, key: key, prior: row.Failures}, nil
}

func refused(failures int32, retryMs int64) *Refused {
	return &Refused{Failures: int(failures),
		RetryAfter: max(time.Second, time.Duration(retryMs)*time.Millisecond), window: max(0, time.Duration(retryMs)*time.Millisecond)}
}

// reserve is strict mode's acquire: one atomic statement that counts the
// attempt up front only while the key is under the limit.
func (l *Limiter) reserve(ctx context.Context, key string) (*Attempt, error) {
	params := &db.LoginAttemptReserveParams{Key: key, WindowMs: l.c.Window.Milliseconds(), MaxFailures: int32(l.c.Limit)}
	for try := 0; ; try++ {
		_, err := l.q.LoginAttemptReserve(ctx, l.pool, params)
		if err == nil {
			return &Attempt{l: l, key: key, reserved: true}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("reserve attempt: %w", err)
		}
		// Refused: read the row for when its window ends. If it is gone by
		// now (cleared, or lapsed and swept), the key is free: try again.
		got, err := l.q.LoginAttemptGet(ctx, l.pool, key)
		if err == nil && int(got.Failures) >= l.c.Limit {
			return nil, refused(got.Failures, got.RetryMs)
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("read throttle: %w", err)
		}
		if try == 2 {
			// The row keeps changing under us; refuse rather than let an
			// unreserved attempt through.
			r := refused(int32(l.c.Limit), time.Second.Milliseconds())
			r.window = 0
			return nil, r
		}
	}
}

// write runs the statements of an outcome, do, bounded by the Limiter's
// Timeout and timed (observe.Record); they outlive ctx's cancellation (a
// client that goes away still has its failure counted). Their error is
// named what.
func (a *Attempt) write(ctx context.Context, what string, do func(context.Context) error) error {
	ctx, cancel := dberr.WithTimeout(context.WithoutCancel(ctx), a.l.c.Timeout)
	defer cancel()
	defer a.l.obs.Took(ctx, observe.Record, time.Now())
	if err := do(ctx); err != nil {
		return fmt.Errorf("%s: %w", what, dberr.OwnTimeout(ctx, err))
	}
	return nil
}

// Fail counts the attempt as a failed sign-in, in a statement of its own
// (strict: the reservation already counted it, nothing is written). An
// error means the failure was not counted.
func (a *Attempt) Fail(ctx context.Context) error {
	if a.reserved {
		return nil
	}
	return a.write(ctx, "record failure", func(ctx context.Context) error {
		_, err := a.l.q.LoginAttemptRecordFailure(ctx, a.l.pool, &db.LoginAttemptRecordFailureParams{
			Key: a.key, WindowMs: a.l.c.Window.Milliseconds(),
		})
		return err
	})
}

// Succeed clears the key's failures (one delete when it had any, or a
// reservation); with KeepOnSuccess it gives back the attempt's own
// reservation and clears nothing.
func (a *Attempt) Succeed(ctx context.Context) error {
	if a.l.c.KeepOnSuccess {
		return a.Release(ctx)
	}
	if !a.reserved && a.prior == 0 {
		return nil
	}
	return a.write(ctx, "clear failures", func(ctx context.Context) error {
		had, err := a.l.q.LoginAttemptClear(ctx, a.l.pool, a.key)
		if err == nil {
			a.l.notifyAfter(ctx, a.key, had)
		}
		return err
	})
}

// Release gives back a strict attempt's reservation (lenient: nothing is
// written); a row left with no failure goes.
func (a *Attempt) Release(ctx context.Context) error {
	if !a.reserved {
		return nil
	}
	return a.write(ctx, "give back reservation", func(ctx context.Context) error {
		left, err := a.l.q.LoginAttemptUnreserve(ctx, a.l.pool, a.key)
		if err != nil {
			return err
		}
		if len(left) == 1 && left[0] == 0 {
			// No failure left: the row goes (a row of none would list the
			// key, every client address that signed in, until its window
			// lapses).
			if _, err := a.l.q.LoginAttemptDeleteEmpty(ctx, a.l.pool, a.key); err != nil {
				a.l.log.WarnContext(ctx, "signin: deleting a row of no failures failed; it lapses with its window", "limit", a.l.c.Name, "err", err)
			}
		}
		for i := range left {
			left[i]++ // what it had before
		}
		a.l.notifyAfter(ctx, a.key, left)
		return nil
	})
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/middleware/upload"
	"github.com/pglimit/pglimit/ratelimit"
)

// Operation names, in the order they are measured and reported.
const (
	OpHeavy    = "heavy claim + release"
	OpInflight = "in-flight claim + release"
	OpCheck    = "sign-in check"
	OpFailure  = "failed sign-in (check + record)"
	OpUpload   = "upload window claim"
	OpRate     = "rate-limit decision"
	// OpRateBorrowed is a decision of a hot key with
	// ratelimit.Options.Borrow: mostly a unit spent in memory, a statement
	// per batch.
	OpRateBorrowed = "rate-limit decision, borrowed"
	// OpInflightKept is a steady token's request through the in-flight
	// cap with inflight.Options.Keep: its slot taken from memory, renewed
	// now and then.
	OpInflightKept = "in-flight claim + release, kept"
)

// Operations lists the operations of the throughput phase.
var Operations = []string{OpHeavy, OpInflight, OpCheck, OpFailure, OpUpload, OpRate, OpRateBorrowed, OpInflightKept}

// What says what one operation does, through the public API.
var What = map[string]string{
	OpHeavy:        "heavy.Limiter.Acquire (a slot of the user's scope and one of the installation's, one round trip) + Permit.Release",
	OpInflight:     "inflight.Limiter.Acquire (a slot of the token's scope) + Permit.Release",
	OpCheck:        "signin.Limiter.Acquire in lenient mode (one read of login_attempt) + Permit.Release (nothing written)",
	OpFailure:      "signin.Limiter.Acquire + Permit.Fail in lenient mode (a read, then an upsert in its own transaction)",
	OpUpload:       "upload.Limiter.Acquire: a slot kept for the window (a user's 1st to 5th upload)",
	OpRate:         "ratelimit.Limiter.Acquire under one policy (one INSERT ... ON CONFLICT DO UPDATE)",
	OpRateBorrowed: "ratelimit.Limiter.Acquire of a client's hot key with Options.Borrow (a unit spent in memory; one statement per batch of about a second of the policy's units)",
	OpInflightKept: "inflight.Limiter.Acquire + Permit.Release with Options.Keep of 1 s, a token per client sending a request every millisecond to the replica that served the last (a steady client: its slot taken from memory, its lease renewed now and then; its latency includes that millisecond)",
}

// noKey is the HTTP Key of the slot limiters used through Acquire only.
func noKey(*http.Request) (string, bool) { return "", false }

// limiters are one replica's limiters, made with the public API over that
// replica's pool, as a service makes them.
type limiters struct {
	heavy    *heavy.Limiter
	inflight *inflight.Limiter
	kept     *inflight.Limiter
	check    *signin.Limiter
	failure  *signin.Limiter
	upload   *upload.Limiter
	rate     *ratelimit.Limiter
	borrow   *ratelimit.Limiter
}

// limiterConfig sets what the phases vary.
type limiterConfig struct {
	replica string
	// heavyLimit, inflightLimit, uploadLimit, failureLimit: the caps.
	heavyLimit, installationLimit, inflightLimit, uploadLimit, failureLimit int
	// window is the upload and sign-in window.
	window time.Duration
	// rate is the rate limit's policy.
	rate ratelimit.Policy
}

func newLimiters(pool *pgxpool.Pool, c limiterConfig) (*limiters, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var l limiters
	var err error
	if l.heavy, err = heavy.New(pool, heavy.Options{
		Name: "scale-heavy", Key: noKey, Limit: c.heavyLimit, Time: 30 * time.Second,
		InstallationLimit: c.installationLimit, Replica: c.replica, Logger: quiet,
	}); err != nil {
		return nil, err
	}
	if l.inflight, err = inflight.New(pool, inflight.Options{
		Key: noKey, Limit: c.inflightLimit, Replica: c.replica, Logger: quiet,
	}); err != nil {
		return nil, err
	}
	if l.kept, err = inflight.New(pool, inflight.Options{
		Name: "scale-kept", Key: noKey, Limit: c.inflightLimit, Replica: c.replica, Logger: quiet, Keep: time.Second,
	}); err != nil {
		return nil, err
	}
	if l.check, err = signin.New(pool, signin.Options{Limit: 5, Window: c.window, Lenient: true, Logger: quiet}); err != nil {
		return nil, err
	}
	if l.failure, err = signin.New(pool, signin.Options{Limit: c.failureLimit, Window: c.window, Lenient: true, Logger: quiet}); err != nil {
		return nil, err
	}
	if l.upload, err = upload.New(pool, upload.Options{
		Key: noKey, Limit: c.uploadLimit, Window: c.window, Replica: c.replica, Logger: quiet,
	}); err != nil {
		return nil, err
	}
	if l.rate, err = ratelimit.New(pool, ratelimit.Options{
		Name: "scale-rate", Policies: []ratelimit.Policy{c.rate}, Logger: quiet,
	}); err != nil {
		return nil, err
	}
	if l.borrow, err = ratelimit.New(pool, ratelimit.Options{
		Name: "scale-borrow", Borrow: true, Logger: quiet,
		Policies: []ratelimit.Policy{{Name: "scale-borrow", Limit: 1_000_000, Window: time.Second}},
	}); err != nil {
		return nil, err
	}
	return &l, nil
}

// refused reports whether err is a limit's refusal.
func refused(err error) bool { return errors.Is(err, pglimit.ErrLimited) }

// heavyOp claims and releases a heavy permit of user, holding it for hold.
// claim is how long Acquire took.
func (l *limiters) heavyOp(ctx context.Context, user string, hold time.Duration) (claim time.Duration, err error) {
	start := time.Now()
	p, err := l.heavy.Acquire(ctx, user)
	claim = time.Since(start)
	if err != nil {
		return claim, err
	}
	sleep(ctx, hold)
	return claim, p.Release(ctx)
}

// inflightOp claims and releases an in-flight slot of token.
func (l *limiters) inflightOp(ctx context.Context, token string, hold time.Duration) (claim time.Duration, err error) {
	start := time.Now()
	p, err := l.inflight.Acquire(ctx, token)
	claim = time.Since(start)
	if err != nil {
		return claim, err
	}
	sleep(ctx, hold)
	return claim, p.Release(ctx)
}

// keptOp claims and releases an in-flight slot of token with kept slots.
func (l *limiters) keptOp(ctx context.Context, token string) error {
	p, err := l.kept.Acquire(ctx, token)
	if err != nil {
		return err
	}
	return p.Release(ctx)
}

// checkOp checks key's sign-in and ends the attempt as neither failure nor
// success (the read a sign-in costs before its password is checked).
func (l *limiters) checkOp(ctx context.Context, key string) error {
	p, err := l.check.Acquire(ctx, key)
	if err != nil {
		return err
	}
	return p.Release(ctx)
}

// failureOp records a failed sign-in of key.
func (l *limiters) failureOp(ctx context.Context, key string) error {
	p, err := l.failure.Acquire(ctx, key)
	if err != nil {
		return err
	}
	return p.Fail(ctx)
}

// uploadOp claims an upload slot of user, kept for the window.
func (l *limiters) uploadOp(ctx context.Context, user string) error {
	_, err := l.upload.Acquire(ctx, user)
	return err
}

// borrowOp decides one request of key, borrowing.
func (l *limiters) borrowOp(ctx context.Context, key string) error {
	_, err := l.borrow.Acquire(ctx, key)
	return err
}

// rateOp decides one request of key.
func (l *limiters) rateOp(ctx context.Context, key string) error {
	_, err := l.rate.Acquire(ctx, key)
	return err
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// keyOf names the n-th key of a kind within a run.
func keyOf(run, kind string, n int) string {
	return fmt.Sprintf("%s-%s-%s", run, kind, strconv.Itoa(n))
}

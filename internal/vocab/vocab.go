// Package vocab is the vocabulary every pglimit package shares: ErrLimited,
// which every refusal matches; Class and Classify, the kinds of failure of
// a database error; MaxLimit, the bound of every cap. The root package
// re-exports each name (pglimit.ErrLimited is vocab.ErrLimited, the same
// value), so adopters use the root; the library's own packages import this
// leaf instead, and none of them imports the root.
package vocab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pglimit/pglimit/internal/dberr"
)

// MaxLimit is the largest cap any pglimit limit accepts (a heavy
// endpoint's per-key cap and its installation cap, a token's requests in
// flight, uploads per window, failed sign-ins per window, a permit scope's
// slots). Every package refuses a larger one in New.
const MaxLimit = 10000

// CheckCap reports a cap outside 1..pglimit.MaxLimit, naming the package
// and the Options field: every limiter checks its caps with it, so the
// messages are the same everywhere.
func CheckCap(pkg, field string, n int) error {
	if n < 1 || n > MaxLimit {
		return fmt.Errorf("%s: %s %d outside 1..pglimit.MaxLimit (%d)", pkg, field, n, MaxLimit)
	}
	return nil
}

// MaxDuration is the longest duration a limiter's option takes (a time
// bound, a window, a keep, a timeout): 366 days. A longer one would add up
// past what a time.Duration holds once a slot's grace is added to it, and
// wrap to a lease that has lapsed before it is taken.
const MaxDuration = 366 * 24 * time.Hour

// CheckDuration reports a duration below a millisecond or above
// MaxDuration, naming the package and the Options field.
func CheckDuration(pkg, field string, d time.Duration) error {
	switch {
	case d < time.Millisecond:
		return fmt.Errorf("%s: %s %v below a millisecond", pkg, field, d)
	case d > MaxDuration:
		return fmt.Errorf("%s: %s %v above 366 days", pkg, field, d)
	}
	return nil
}

// OrDefault sets *v to def when it is zero and reports a negative one,
// naming the package and the Options field: every limiter fills the
// defaults of its Options with it, so the messages are the same
// everywhere.
func OrDefault[T ~int | ~int64](pkg, field string, v *T, def T) error {
	if *v < 0 {
		return fmt.Errorf("%s: %s %v is negative", pkg, field, *v)
	}
	if *v == 0 {
		*v = def
	}
	return nil
}

// ErrLimited is matched (errors.Is) by every refusal of every limiter:
// *limit.Refusal (heavy, inflight, upload, signin),
// *ratelimit.LimitError and *quota.LimitError. Use errors.As with that
// type for its fields (the limit, the scope, when to retry).
var ErrLimited = errors.New("pglimit: limit reached")

// ErrInvalidCost is matched by the error of a cost the rate or the quota
// cannot charge: a negative one, or (quota) one above quota.MaxLimit; the
// cost is a caller's mistake, not the client's.
var ErrInvalidCost = errors.New("pglimit: invalid cost")

// ErrSettled is returned by a second Settle of one rate or quota Permit.
var ErrSettled = errors.New("pglimit: permit already settled")

// MaxAmount is the largest amount a quota or an override counts: 2^53, the
// largest integer a JSON number carries exactly.
const MaxAmount = 1 << 53

// Class is what kind of failure a database error is, as Classify tells it.
// Its value is its name, ready for a log line or a metric attribute.
type Class string

const (
	// ClassNone is no error at all.
	ClassNone Class = "none"
	// ClassCanceled is the caller's context canceled: a client went away.
	// It is not a server error and is not logged as one.
	ClassCanceled Class = "canceled"
	// ClassUnavailable is a database that cannot be reached: a failed
	// connect, a broken connection, a server shutting down or starting up,
	// too many connections, a primary that became read-only in a failover
	// (SQLSTATE 25006), a serialization failure or deadlock the database
	// rolled back (40001, 40P01), or a limiter's own Timeout option
	// expired while it connected or waited: the database cannot decide
	// now. Answer 503 with Retry-After; it passes.
	ClassUnavailable Class = "unavailable"
	// ClassTimeout is a statement stopped at its time bound:
	// statement_timeout (SQLSTATE 57014) or a context deadline.
	ClassTimeout Class = "timeout"
	// ClassOther is any other error: a bug, a constraint, a syntax error.
	// Answer 500 and log it; never send its text to a client.
	ClassOther Class = "other"
)

// Classify tells what kind of failure err is, for every error pglimit
// returns and for the pgx errors of a service's own queries. It looks, in
// this order, for: nil; context.Canceled; a limiter's own Timeout or a
// failed connect (unavailable); a context deadline or SQLSTATE 57014
// (timeout); a connection-class or resource SQLSTATE (08, 57 other than
// 57014, 53), a read-only transaction (25006, a demoted primary), a
// serialization failure or deadlock (40001, 40P01), a network error or a
// closed connection (unavailable).
// Everything else is ClassOther.
func Classify(err error) Class {
	switch {
	case err == nil:
		return ClassNone
	case errors.Is(err, context.Canceled):
		return ClassCanceled
	case dberr.IsOwnTimeout(err), dberr.IsConnectError(err):
		return ClassUnavailable
	case dberr.IsTimeout(err):
		return ClassTimeout
	case dberr.IsUnavailable(err):
		return ClassUnavailable
	}
	return ClassOther
}

// ClassOf is Classify(err), except that work whose caller's ctx was
// canceled is ClassCanceled whatever err says.
func ClassOf(ctx context.Context, err error) Class {
	if dberr.IsCanceled(ctx, err) {
		return ClassCanceled
	}
	return Classify(err)
}

// LogFailure logs err, a failed decision, through log at the level its
// class (ClassOf with ctx) deserves: Debug, as "request canceled: the
// client went away", for a caller that went away; Warn for a database
// that cannot be reached or timed out; Error otherwise.
func LogFailure(ctx context.Context, log *slog.Logger, msg string, err error, args ...any) {
	c := ClassOf(ctx, err)
	args = append(args, "class", string(c), "err", err)
	switch c {
	case ClassCanceled:
		log.DebugContext(ctx, "request canceled: the client went away", append(args, "during", msg)...)
	case ClassUnavailable, ClassTimeout:
		log.WarnContext(ctx, msg, args...)
	default:
		log.ErrorContext(ctx, msg, args...)
	}
}
